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
