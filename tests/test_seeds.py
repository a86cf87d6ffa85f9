"""The one derivation of seeds (mptlml.seeds) against numpy's SeedSequence, and the one check."""

import numpy as np
import pytest

from mptlml.seeds import check_seed, check_seeds, spawn, text_key


def test_spawn_is_seedsequence_first_word():
    for keys in [(0,), (3, 1), (7, 2, 5), (2**40, 1, 2, 3)]:
        ref = np.random.SeedSequence(list(keys)).generate_state(1)[0]
        assert spawn(*keys) == int(ref)


def test_spawn_keys_give_distinct_streams():
    seen = {spawn(5, i, r) for i in range(20) for r in range(20)}
    assert len(seen) == 400


def test_text_key_distinguishes_texts_and_their_splits():
    assert text_key("ab") != text_key("ab ")
    assert spawn(0, text_key("ab"), text_key("c")) != spawn(0, text_key("a"), text_key("bc"))
    assert spawn(0, text_key("é")) == spawn(0, text_key("é"))


@pytest.mark.parametrize("bad", ["12", b"1", True, False, 1.0, None, np.bool_(True)])
def test_check_seed_refuses_what_is_not_an_int(bad):
    with pytest.raises(TypeError, match="seed must be a non-negative int"):
        check_seed(bad)


def test_check_seed_takes_ints_and_refuses_negatives():
    assert check_seed(np.int64(4)) == 4 and check_seed(0) == 0
    with pytest.raises(ValueError, match="non-negative"):
        check_seed(-1)


@pytest.mark.parametrize("bad", ["12", b"12"])
def test_a_string_is_not_a_list_of_seeds(bad):
    with pytest.raises(TypeError, match="an int or a list of 2 ints"):
        check_seeds(bad, 2)


def test_check_seeds_counts_and_names_the_item():
    assert check_seeds([1, np.int32(2)], 2) == [1, 2]
    with pytest.raises(ValueError, match="holds 3 seeds for 2"):
        check_seeds([1, 2, 3], 2)
    with pytest.raises(TypeError, match=r"seed\[1\]"):
        check_seeds([1, "2"], 2)
