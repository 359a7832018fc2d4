"""Tensor-parallel decoding: the ranks that share a target sharded by transformers' TP plan run one decode loop
together, and this module is how they stay in step (the process group, the decisions rank 0 makes for all, the
errors when a rank fails).

Every rank holds its shard of the target, with its local KV heads in its own slab (specdec.kv.slab), and runs the
same forwards with the same shapes: the all-reduces inside those forwards sum every rank's share of ONE batch, so
if two ranks fed different ids, positions or masks, the sums would mix two batches and still look like logits.
So each decision that shapes a forward is made once, by rank 0, and sent to the others over a small gloo group of
int64 CPU tensors (no device sync on an NCCL setup beyond the step's own readback):

    decision                          collective (on the control group)
    the generator's seed              agree_start: one all-gather per generate() call, which also checks that
                                      every rank was given the same prompts and arguments
    the first tokens of admitted rows agree_tokens: one broadcast per admission
    the step's width and draft counts agree_plan: one broadcast per step (none for a fixed-K controller)
    a draft model's early stop        agree_flag: one broadcast per draft the drafter asks about (adaptive only)
    tokens, accept counts, bins       agree_outcome: one broadcast per step of what the step's one readback
                                      reads anyway, rank 0's drafts riding along to be checked

Why nothing else can diverge. Everything else the loop decides is a function of host ints that are now equal on
every rank: the prompts (checked), the emitted tokens and accept counts (rank 0's), the plan (rank 0's). EOS and
max_new_tokens cuts, retiring and refilling rows, EXSPEC's groups (pool lengths), the drafters' bookkeeping and
every realignment follow from those. What is NOT trusted to agree by itself:
  - the controller's choices follow timings, which differ per rank: rank 0's plan and stop decisions are used;
  - sampled tokens: the noise is equal (one seed, drawn in the same order with the same shapes on every rank), and
    the logits here are bitwise equal on both ranks (the all-reduce hands every rank the same sum; the ranks'
    own results are compared with rank 0's every step and counted in stats["tensor_parallel"]["disagreements"]),
    but no backend promises that in general: a last-bit difference at a near-tie would fork the ranks, so rank
    0's tokens are broadcast. Every rank still runs the sampling op, so its generator advances as rank 0's does:
    that keeps the draft model's sampled drafts equal;
  - the drafts: the draft model (or n-gram drafter) runs replicated with the same weights, inputs and noise, and
    deterministic kernels give the same drafts. They feed the verify forward, where a mismatch would silently mix
    batches, so every rank compares its drafts with rank 0's (in agree_outcome) and raises if they differ.

Failures end the run on every rank with an error, never a hang: a collective that fails raises
TensorParallelError naming the rank and what it was agreeing on. A rank whose process dies releases the others
at once (gloo reports the closed connection; NCCL's watchdog aborts); a rank that is alive but stuck or out of
step costs the process group's timeout (init_process_group sets it; the control group has its own).

Not supported, refused with a reason: a tp group smaller than the world (data x tensor parallel meshes), and
targets split across devices by a device_map (pipeline split, see check_placement).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import time
import torch

from ..kv.slab import tensor_parallel_size
from .control import Plan, SpeculationController

# Seconds a rank waits in a collective for the others before it gives up with an error.
DEFAULT_TIMEOUT = 120.0
# Seconds the ranks may wait for each other while they load (reading a big checkpoint can take one rank minutes).
LOAD_TIMEOUT = 1800.0
_U64 = (1 << 64) - 1


class TensorParallelError(RuntimeError):
    """A tensor-parallel run could not go on: a collective failed or timed out, or the ranks disagree."""


def distributed_available() -> bool:
    return torch.distributed.is_available()


def init_process_group(device: str | torch.device = "cpu", timeout: float = DEFAULT_TIMEOUT) -> tuple[int, int]:
    """Join the process group that `python -m torch.distributed.run` (or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)
    describes, unless it is joined already: gloo for CPU targets, NCCL for CUDA ones (each rank on the device
    LOCAL_RANK). Its collectives may wait max(timeout, LOAD_TIMEOUT) seconds while the ranks load their shards
    (one may read its files much later than another); bound_collectives(timeout) tightens that once all have
    loaded. Returns (rank, world size)."""
    dist = torch.distributed
    if not dist.is_available():
        raise TensorParallelError("this torch build has no torch.distributed: tensor parallelism is unavailable")
    if not dist.is_initialized():
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise TensorParallelError(f"no process group to join ({', '.join(missing)} not set): launch with "
                                      "`python -m torch.distributed.run --nproc-per-node N ...`")
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=max(timeout, LOAD_TIMEOUT)))
    return dist.get_rank(), dist.get_world_size()


def bound_collectives(timeout: float = DEFAULT_TIMEOUT) -> None:
    """Every rank has loaded: wait for the others (under the loading timeout), then let every collective of the
    default group (the model's own all-reduces) wait at most `timeout` seconds, so that a stuck rank ends the run
    with an error instead of a long hang."""
    dist = torch.distributed
    try:
        dist.barrier()
    except Exception as err:
        raise TensorParallelError(f"tensor-parallel rank {dist.get_rank()}: the other ranks did not finish loading "
                                  f"({err})") from err
    group = dist.distributed_c10d._get_default_group()
    try:
        group.set_timeout(datetime.timedelta(seconds=timeout))
    except (AttributeError, RuntimeError):  # a backend that cannot change it keeps the timeout it started with
        pass


def local_device(device: str | torch.device) -> torch.device:
    """A rank's own device for `device`: cuda means this rank's GPU (LOCAL_RANK), cpu stays cpu."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def check_placement(model, name: str) -> None:
    """Refuse a model split across devices (a device_map over several GPUs, or offloaded to CPU or disk).

    Pipeline splits are not supported: the engine keeps each model's KV cache in ONE slab on one device, so that
    a realignment is one shift of one tensor; a split model would need one slab per device (each holding that
    device's layers, realigned with its own launches), and its stages would run one after another in every
    forward: the speed of one device with the memory of several. Tensor parallelism shards every layer instead,
    and every rank keeps its slab on its own device."""
    devices = {str(p.device) for p in model.parameters()}
    mapped = getattr(model, "hf_device_map", None)
    if isinstance(mapped, dict):
        devices |= {str(d) for d in mapped.values()}
    if len(devices) > 1 or "meta" in devices or "disk" in devices:
        raise ValueError(f"the {name} is split across devices ({', '.join(sorted(devices))}, a device_map): "
                         "pipeline splits are not supported (the engine keeps one KV slab per model on one device); "
                         "shard it with tensor parallelism instead (transformers' tp_plan, `specdec run --tp N`), "
                         "or load it on one device")


def fingerprint(*parts) -> int:
    """A stable 63-bit hash of the arguments' repr (the same on every rank, unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _decides_alone(controller: SpeculationController | None) -> bool:
    """A fixed-K controller's plan and stop rule depend on the drafter's offers only (no timings): every rank
    reaches the same decisions without a collective."""
    return controller is not None and not controller.enabled \
        and type(controller).plan is SpeculationController.plan \
        and type(controller).keep_drafting is SpeculationController.keep_drafting


_CONTROL_GROUPS: dict[float, object] = {}


def _control_group(timeout: float):
    """The gloo group the decisions travel on, one per timeout and process (creating one is a collective, which
    every rank reaches in the same order: when it builds its first decoder with that timeout)."""
    group = _CONTROL_GROUPS.get(timeout)
    if group is None:
        group = _CONTROL_GROUPS[timeout] = torch.distributed.new_group(
            backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    return group


class TensorParallelRanks:
    """The ranks of one tensor-parallel target, as the decode loop and the decoder see them. Build it on every
    rank, in the same order (creating the control group is a collective)."""

    def __init__(self, size: int, timeout: float = DEFAULT_TIMEOUT):
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            raise TensorParallelError(f"the target is sharded over {size} ranks but no process group is joined "
                                      "(specdec.scheduling.distributed.init_process_group)")
        world = dist.get_world_size()
        if world != size:
            raise TensorParallelError(f"the target is sharded over {size} ranks but the process group has {world}: "
                                      "every rank of the world must hold a shard of the same target (data x tensor "
                                      "parallel meshes are not supported)")
        self.size, self.rank = size, dist.get_rank()
        self.timeout = float(timeout)
        self.group = _control_group(self.timeout)
        self.collectives = 0
        self.seconds = 0.0
        self.disagreements = 0  # collectives where this rank's own tokens or counts differed from rank 0's
        # collectives where this rank's own controller chose otherwise than rank 0's (its timings are its own)
        self.overrides = 0
        self.by_kind: dict[str, int] = {}

    @classmethod
    def for_model(cls, model, timeout: float | None = None) -> "TensorParallelRanks | None":
        size = tensor_parallel_size(model)
        if size <= 1:
            return None
        return cls(size, DEFAULT_TIMEOUT if timeout is None else timeout)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------------------------------- collectives
    def _run(self, kind: str, op) -> None:
        t = time.perf_counter()
        try:
            op()
        except Exception as err:  # gloo raises RuntimeError subclasses (DistBackendError, DistNetworkError, ...)
            raise TensorParallelError(
                f"tensor-parallel rank {self.rank} of {self.size}: agreeing on {kind} failed: {err}. Another rank "
                f"probably failed first (see its error) or is stuck (timeout {self.timeout:g} s)") from err
        finally:
            self.seconds += time.perf_counter() - t
            self.collectives += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def _broadcast(self, kind: str, values: torch.Tensor) -> torch.Tensor:
        """Rank 0's `values` (an int64 CPU tensor of the same shape on every rank)."""
        buf = values.clone() if self.leader else torch.empty_like(values)
        self._run(kind, lambda: torch.distributed.broadcast(buf, src=0, group=self.group))
        return buf

    def agree_start(self, seed: int | None, digest: int) -> int:
        """The seed every rank uses (rank 0's, or one rank 0 draws when it has none); raises on every rank when
        the ranks were given different arguments (digest: a fingerprint of them)."""
        mine = seed if seed is not None else torch.Generator().seed()
        signed = (mine & _U64) - (1 << 64) if (mine & _U64) >= 1 << 63 else mine & _U64
        local = torch.tensor([signed, digest], dtype=torch.int64)
        gathered = [torch.empty_like(local) for _ in range(self.size)]
        self._run("seed and arguments", lambda: torch.distributed.all_gather(gathered, local, group=self.group))
        digests = [int(g[1]) for g in gathered]
        if len(set(digests)) > 1:
            differ = [r for r, d in enumerate(digests) if d != digests[0]]
            raise TensorParallelError(f"tensor-parallel ranks {differ} were given other prompts or generate() "
                                      "arguments than rank 0: every rank must make the same call")
        return int(gathered[0][0]) & _U64

    def agree_plan(self, plan: Plan, controller: SpeculationController | None) -> Plan:
        """Rank 0's width and per-row draft counts."""
        if _decides_alone(controller):
            return plan
        local = torch.tensor([plan.width] + list(plan.num_draft), dtype=torch.int64)
        agreed = self._broadcast("the plan", local)
        values = agreed.tolist()
        if values != local.tolist():
            self.overrides += 1
            plan.width, plan.num_draft = values[0], values[1:]
        return plan

    def agree_flag(self, flag: bool, controller: SpeculationController | None) -> bool:
        """Rank 0's answer to a yes/no decision (go on drafting?)."""
        if _decides_alone(controller):
            return flag
        agreed = bool(self._broadcast("early stop", torch.tensor([int(flag)], dtype=torch.int64))[0])
        self.overrides += agreed != bool(flag)
        return agreed

    def agree_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rank 0's tokens (int64 [n] on the device), e.g. the first tokens of admitted prompts."""
        local = tokens.to("cpu", torch.int64)
        agreed = self._broadcast("first tokens", local)
        if self.leader:
            return tokens
        if not torch.equal(agreed, local):
            self.disagreements += 1
            return agreed.to(tokens.device, non_blocking=True)
        return tokens

    def agree_outcome(self, packed: torch.Tensor, drafts: torch.Tensor | None) -> tuple[list[list[int]], torch.Tensor]:
        """The step's outcome as rank 0 read it: packed int64 [B, 1 + w + ...] = (accepted, tokens [w], bins...)
        on the device, drafts [B, w - 1] the tokens this rank verified (None for a plain step). Returns the host
        rows (the step's one readback) and `last` [B] on the device (tokens[b, accepted[b]]).
        Raises when this rank verified other drafts than rank 0 (its verify forward mixed two batches)."""
        width = packed.shape[1]
        local = (packed if drafts is None else torch.cat([packed, drafts], dim=1)).to("cpu")
        agreed = self._broadcast("tokens and accept counts", local)
        if not self.leader and not torch.equal(agreed, local):
            if drafts is not None and not torch.equal(agreed[:, width:], local[:, width:]):
                raise TensorParallelError(
                    f"tensor-parallel rank {self.rank} drafted other tokens than rank 0: the replicated drafter is "
                    "not deterministic here (different weights, or non-deterministic kernels), so the ranks "
                    "verified different batches")
            self.disagreements += 1
        agreed = agreed[:, :width]
        last = agreed.gather(1, agreed[:, :1] + 1).squeeze(1).to(packed.device, non_blocking=True)
        return agreed.tolist(), last

    @contextlib.contextmanager
    def guard(self):
        """Errors inside a tensor-parallel run (a collective of the model's own forward, this module's, or any
        rank-local failure) come out as TensorParallelError naming this rank: the others cannot go on either."""
        try:
            yield
        except TensorParallelError:
            raise
        except Exception as err:
            raise TensorParallelError(f"tensor-parallel decoding failed on rank {self.rank} of {self.size}: "
                                      f"{type(err).__name__}: {err}") from err

    def stats(self) -> dict:
        return {"ranks": self.size, "rank": self.rank, "collectives": self.collectives,
                "collectives_by_kind": dict(self.by_kind), "collective_seconds": self.seconds,
                "disagreements": self.disagreements, "overrides": self.overrides}

    def reset_stats(self) -> None:
        self.collectives, self.seconds, self.disagreements, self.overrides, self.by_kind = 0, 0.0, 0, 0, {}


def guarded(ranks: TensorParallelRanks | None):
    """ranks.guard(), or nothing for a single-process run."""
    return ranks.guard() if ranks is not None else contextlib.nullcontext()
