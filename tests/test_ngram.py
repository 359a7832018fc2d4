"""The prompt-lookup n-gram index: latest earlier occurrence, longest suffix first, ragged proposals."""

import pytest
import torch

from specdec.kv.batch import StepBatch
from specdec.drafting.ngram import NgramDrafter, NgramIndex


def brute_force(tokens, k, max_n, min_n):
    """Straight from the definition: scan every earlier position, newest first."""
    length = len(tokens)
    for n in range(min(max_n, length), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):  # an occurrence that ends before the last token
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


@pytest.mark.parametrize("tokens,k,expect", [
    pytest.param([1, 2, 3, 9, 1, 2, 3], 3, [9, 1, 2], id="trigram"),
    pytest.param([1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3], 2, [8, 5], id="latest-occurrence-wins"),
    pytest.param([4, 5, 6], 2, [], id="no-match"),
    pytest.param([7, 7], 4, [7], id="overlap-runs-to-end"),
    pytest.param([1, 2, 1], 5, [2, 1], id="unigram-fallback"),
    pytest.param([3], 2, [], id="single-token"),
])
def test_propose_examples(tokens, k, expect):
    assert NgramIndex(tokens, max_n=3, min_n=1).propose(k) == expect


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("max_n,min_n", [(3, 1), (4, 2), (1, 1)], ids=["3-1", "4-2", "1-1"])
def test_incremental_index_equals_brute_force(seed, max_n, min_n):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 6, (80,), generator=gen).tolist()
    index = NgramIndex(tokens[:5], max_n, min_n)
    for t in range(5, len(tokens)):
        assert index.propose(4) == brute_force(tokens[:t], 4, max_n, min_n), f"after {t} tokens"
        index.extend([tokens[t]])


def test_drafter_rows_are_ragged_and_follow_accepts():
    drafter = NgramDrafter(max_n=2, min_n=1)
    drafter.start(10, [5, 6, 7, 5, 6], 7)
    drafter.start(11, [1, 2, 3], 4)
    batch = StepBatch([10, 11], None, torch.zeros(2, dtype=torch.int64))
    # Row 0 is 5 6 7 5 6 7: its suffix "6 7" first came at index 1 and was followed by 5 6 7. Row 1 has no match.
    assert drafter.offer(batch, 3) == [[("ngram", 2, 1), ("ngram", 2, 2), ("ngram", 2, 3)], []]
    proposal = drafter.propose(batch, 3)
    assert proposal.probs is None
    assert proposal.num_draft == [3, 0]
    assert proposal.tokens[0].tolist() == [5, 6, 7] and proposal.tokens[1].tolist() == [-1, -1, -1]
    # Row 1 emits [9, 1]: its history ends "... 4 9 1", and "1" was followed by "2" earlier.
    assert drafter.commit(batch, proposal, [[5, 6], [9, 1]]) is None
    assert drafter.propose(batch, 2).tokens[1].tolist() == [2, 3]
    drafter.finish(10)
    assert list(drafter.seqs) == [11] and drafter.seqs[11].tokens[-2:] == [9, 1]


def test_bad_sizes():
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(max_n=1, min_n=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hindsight_judges_unverified_drafts_by_the_tokens_that_follow(seed):
    # The target's text is a fixed stream; each step verifies a random number of the offered drafts (0: a plain
    # step) and emits the accepted ones plus the stream's next token, as greedy verification does. Every offer
    # whose verified drafts were all accepted and that had drafts left is judged on the stream, from brute force.
    gen = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, 4, (120,), generator=gen).tolist()
    rng = torch.Generator().manual_seed(seed + 100)
    drafter = NgramDrafter(max_n=3, min_n=1)
    drafter.hindsight = True
    drafter.start(0, stream[:10], stream[10])
    batch = StepBatch([0], None, torch.zeros(1, dtype=torch.int64))
    pos, expected, judged = 11, [], []
    while pos < 100:
        keys = drafter.offer(batch, 4)
        offer = drafter._offered[0][0]
        c = int(torch.randint(0, len(offer) + 1, (1,), generator=rng))
        proposal = None
        if c:
            proposal = drafter.propose(batch, 4).narrowed([c])
        a = 0
        while a < c and offer[a] == stream[pos + a]:
            a += 1
        emitted = stream[pos:pos + a + 1]
        drafter.commit(batch, proposal, [emitted])
        if a == c and c < len(offer):
            rest = offer[c:]
            m = 0
            while m < len(rest) and rest[m] == stream[pos + c + m]:
                m += 1
            expected.append((0, keys[0][c:c + min(m + 1, len(rest))], m, pos + c + min(m + 1, len(rest))))
        pos += a + 1
        judged += drafter.judged()
    decided = [e[:3] for e in expected if e[3] <= pos]  # the stream up to pos has been emitted
    assert sorted(judged) == sorted(decided)
    assert any(j[2] > 0 for j in judged) and any(j[2] < len(j[1]) for j in judged)
    drafter.finish(0)
    assert not drafter._open and drafter.judged() == []


def test_no_hindsight_unless_asked():
    # fixed K (and any run without an adaptive controller) keeps nothing for hindsight
    drafter = NgramDrafter(max_n=2, min_n=1)
    drafter.start(10, [5, 6, 7, 5, 6], 7)
    batch = StepBatch([10], None, torch.zeros(1, dtype=torch.int64))
    assert drafter.offer(batch, 3)[0]
    drafter.commit(batch, None, [[5]])
    assert drafter.judged() == [] and not drafter._open and not drafter._step_offer
    drafter.hindsight = True
    drafter.offer(batch, 3)  # "7 5" was followed by 6 7 5: the target emits 6 then 0
    drafter.commit(batch, None, [[6]])
    drafter.offer(batch, 3)
    drafter.commit(batch, None, [[0]])
    assert drafter.judged()[0] == (10, [("ngram", 2, 1), ("ngram", 2, 2)], 1)
