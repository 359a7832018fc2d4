"""The engine's KV cache: one preallocated slab per model, written in place.

transformers' DynamicCache concatenates on every update, an O(T) copy per layer per step. Here all layers'
keys and values live in ONE tensor

    slab[B, 2 * num_layers, kv_heads, capacity, head_dim]     layer i: keys = slab[:, 2i], values = slab[:, 2i+1]

so that a per-row realignment of the whole cache is a single `sk.shift_rows_` call on one tensor, and a step
writes only its new columns. Columns are absolute: [start, length) is live; columns before `start` are left
padding in every row. The owner (specdec.kv.ragged.RaggedKV) moves `length` and `start`; update() only writes.

A tensor-parallel model (transformers' TP plan: its attention runs on this rank's share of the heads) writes only
its local KV heads, so its slab holds kv_heads / tp heads; update() refuses keys with any other head count, since
a slab of the global count would silently broadcast one local head into every slot.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .geometry import kv_geometry


class SlabLayer(CacheLayerMixin):
    """One layer's window onto the shared slab. keys/values are views, never copies."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, owner: "SlabCache", index: int):
        super().__init__()
        self.owner = owner
        self.index = index
        self.is_initialized = True

    # transformers reads .keys/.values in a few places (e.g. cross-attention reuse); hand it the live window.
    @property
    def keys(self):
        o = self.owner
        return o.slab[:, 2 * self.index, :, o.start:o.length + o.pending]

    @keys.setter
    def keys(self, value):  # CacheLayerMixin.__init__ assigns None; the slab is the only storage
        pass

    @property
    def values(self):
        o = self.owner
        return o.slab[:, 2 * self.index + 1, :, o.start:o.length + o.pending]

    @values.setter
    def values(self, value):
        pass

    def lazy_initialization(self, key_states, value_states):
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        o = self.owner
        n = key_states.shape[-2]
        if key_states.shape[-3] != o.slab.shape[2]:
            raise RuntimeError(f"layer {self.index} wrote {key_states.shape[-3]} KV heads but the slab holds "
                               f"{o.slab.shape[2]} (a tensor-parallel model writes kv_heads / tp heads per rank: "
                               "build the cache with SlabCache.for_model)")
        if n != o.pending:
            raise RuntimeError(f"layer {self.index} wrote {n} columns but the cache expected {o.pending} "
                               "(call SlabCache.reserve(n) before the forward)")
        end = o.length + n
        o.slab[:, 2 * self.index, :, o.length:end] = key_states
        o.slab[:, 2 * self.index + 1, :, o.length:end] = value_states
        return o.slab[:, 2 * self.index, :, o.start:end], o.slab[:, 2 * self.index + 1, :, o.start:end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length - self.owner.start + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.length - self.owner.start

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.owner.slab.zero_()


class SlabCache(Cache):
    """A transformers Cache over one slab. Use: reserve(n) (grows the capacity by doubling if needed), run the
    model forward on n new tokens (every layer writes columns [length, length + n)), then commit()."""

    def __init__(self, batch: int, num_layers: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.num_layers = num_layers
        self.slab = torch.zeros(batch, 2 * num_layers, kv_heads, max(1, capacity), head_dim, dtype=dtype,
                                device=device)
        self.start = 0
        self.length = 0
        self.pending = 0
        super().__init__(layers=[SlabLayer(self, i) for i in range(num_layers)])

    @classmethod
    def for_model(cls, model, batch: int, capacity: int) -> "SlabCache":
        layers, kv_heads, head_dim = kv_geometry(model.config)
        kv_heads = local_kv_heads(kv_heads, tensor_parallel_size(model))
        p = next(model.parameters())
        return cls(batch, layers, kv_heads, head_dim, capacity, dtype=p.dtype, device=p.device)

    @property
    def capacity(self) -> int:
        return self.slab.shape[-2]

    @property
    def batch(self) -> int:
        return self.slab.shape[0]

    def live(self, end: int | None = None) -> torch.Tensor:
        """The slab's live columns [start, end) (default end: length), as one view for shift_rows_(dim=-2)."""
        return self.slab[..., self.start:self.length if end is None else end, :]

    def reserve(self, n: int) -> None:
        self.ensure_capacity(self.length + n)
        self.pending = n

    def commit(self) -> None:
        self.length += self.pending
        self.pending = 0

    def ensure_capacity(self, end: int) -> None:
        """Make columns up to `end` writable; doubling keeps the number of reallocations logarithmic."""
        if end <= self.capacity:
            return
        cap = self.capacity
        while cap < end:
            cap *= 2
        self.relocate(cap, self.start)

    def relocate(self, capacity: int, new_start: int) -> None:
        """Move the live columns [start, length) into a fresh slab of `capacity` columns, starting at new_start."""
        live = self.length - self.start
        if new_start + live > capacity:
            raise ValueError(f"{live} live columns do not fit at {new_start} in a capacity of {capacity}")
        slab = self.slab.new_zeros(*self.slab.shape[:3], capacity, self.slab.shape[-1])
        slab[..., new_start:new_start + live, :] = self.slab[..., self.start:self.length, :]
        self.slab, self.start, self.length = slab, new_start, new_start + live

    def select_rows(self, index: torch.Tensor) -> None:
        self.slab = self.slab.index_select(0, index)

    # transformers API used by generation utilities; the engine never crops through it
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length - self.start

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.length - self.start + query_length, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.length - self.start


def tensor_parallel_size(model) -> int:
    """How many ranks share `model` by tensor parallelism: transformers records the degree when it shards a model
    with a TP plan (`_tp_size`); parameters that are DTensors tell it too. 1 for a whole model."""
    size = getattr(model, "_tp_size", None)
    if isinstance(size, int) and size > 1:
        return size
    mesh = getattr(next(model.parameters(), None), "device_mesh", None)  # a DTensor parameter
    return int(mesh.size()) if mesh is not None else 1


def local_kv_heads(kv_heads: int, tp: int) -> int:
    """The KV heads one rank of a tp-way sharded model holds (its attention shards the heads evenly)."""
    if kv_heads % tp:
        raise ValueError(f"{kv_heads} KV heads do not split evenly over {tp} tensor-parallel ranks")
    return kv_heads // tp


def round_up_pow2(n: int) -> int:
    """Capacities are powers of two, so growth by doubling reallocates log2(length) times."""
    return 1 << max(0, int(n) - 1).bit_length()
