"""The tile schedule: skip bound vs mask, the lesson's exercise 4, ragged tiles, both causal variants."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import simflash as sf


def test_lesson_exercise_4_query_tile_5():
    sched = sf.TileSchedule(4096, 4096, 128, 64, causal=True)
    i = 4  # the lesson's 1-based tile i = 5: rows 513..640
    assert sched.q_rows(i) == slice(512, 640)
    assert sched.kv_tiles(i) == list(range(10))  # the lesson's j = 1 .. 2i = 10
    kinds = [sched.tile_kind(i, j) for j in range(sched.n_kv_tiles)]
    assert kinds[:8] == ["full"] * 8
    assert kinds[8:10] == ["masked", "masked"]
    assert set(kinds[10:]) == {"skipped"}
    # Tile 9 (0-based 8, columns 513..576): triangular for the upper 64 rows, all visible to the lower 64.
    mask8 = sched.mask(i, 8)
    assert np.array_equal(mask8[:64], np.tril(np.ones((64, 64), bool))) and mask8[64:].all()
    # Tile 10 (0-based 9, columns 577..640): nothing for the upper 64 rows, triangular for the lower 64.
    mask9 = sched.mask(i, 9)
    assert not mask9[:64].any() and np.array_equal(mask9[64:], np.tril(np.ones((64, 64), bool)))


def test_removing_the_mask_changes_the_answer():
    """Keep the skip bound but drop the mask: the upper rows of a query tile attend to the future."""
    from simflash.verify import NoMaskSchedule, run_algorithm

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((16, 8)).astype(np.float32) for _ in range(3))
    masked = run_algorithm("fa2", q, k, v, sf.TileSchedule(16, 16, 4, 2, causal=True), 8**-0.5)
    unmasked = run_algorithm("fa2", q, k, v, NoMaskSchedule(16, 16, 4, 2, causal=True), 8**-0.5)
    np.testing.assert_array_equal(masked, sf.flash_attention(q, k, v, 4, 2, causal=True, dtype="float32").out)
    changed = np.abs(masked - unmasked).max(axis=1) > 1e-3
    # Rows whose diagonal tile reaches past them change; the last row of each query tile sees its whole tile.
    assert changed.any() and not changed[3::4].any()


@given(n_q=st.integers(1, 40), n_kv=st.integers(1, 40), block_q=st.integers(1, 12), block_kv=st.integers(1, 12),
       causal=st.booleans(), variant=st.sampled_from(["upper_left", "lower_right"]))
def test_schedule_agrees_with_the_element_mask(n_q, n_kv, block_q, block_kv, causal, variant):
    """Brute force from the definition: row r sees column c iff c <= r + offset (np.tri), offset 0 for
    upper_left and n_kv - n_q for lower_right. A tile is skipped iff its block of that mask is all False,
    masked iff mixed, full iff all True; blocks are cut by hand, not with the schedule's slices."""
    sched = sf.TileSchedule(n_q, n_kv, block_q, block_kv, causal, variant)
    offset = 0 if variant == "upper_left" else n_kv - n_q
    full_mask = np.tri(n_q, n_kv, k=offset, dtype=bool) if causal else np.ones((n_q, n_kv), bool)
    n_q_tiles, n_kv_tiles = -(-n_q // block_q), -(-n_kv // block_kv)
    assert (sched.n_q_tiles, sched.n_kv_tiles) == (n_q_tiles, n_kv_tiles)
    for i in range(n_q_tiles):
        rows = np.arange(n_q)[i * block_q:(i + 1) * block_q]
        visited = set(sched.kv_tiles(i))
        for j in range(n_kv_tiles):
            cols = np.arange(n_kv)[j * block_kv:(j + 1) * block_kv]
            tile = full_mask[np.ix_(rows, cols)]
            expected = "skipped" if not tile.any() else "full" if tile.all() else "masked"
            assert sched.tile_kind(i, j) == expected
            assert (j in visited) == (expected != "skipped")
            if expected != "skipped":
                assert np.array_equal(sched.mask(i, j), tile)
        assert sorted(visited) == list(range(len(visited)))  # the skip bound is a prefix of KV tiles


def test_either_block_may_be_larger():
    sched = sf.TileSchedule(100, 100, 16, 64, causal=True)
    assert sched.kv_tiles(0) == [0] and sched.tile_kind(0, 0) == "masked"
    assert sched.kv_tiles(6) == [0, 1]  # rows 96..99 see columns up to 99
    assert sched.kind_map().shape == (7, 2)


@pytest.mark.parametrize("args, name", [((0, 4, 2, 2), "n_q"), ((4, 4, 2, -2), "block_kv"), ((4, 4.5, 2, 2), "n_kv")])
def test_schedule_rejects_bad_sizes(args, name):
    with pytest.raises(ValueError, match=name):
        sf.TileSchedule(*args)


def test_schedule_rejects_unknown_causal_variant():
    with pytest.raises(ValueError, match="causal_variant"):
        sf.TileSchedule(4, 4, 2, 2, causal=True, causal_variant="bottom_right")


def test_tile_kind_outside_the_grid():
    with pytest.raises(IndexError, match="outside"):
        sf.TileSchedule(4, 4, 2, 2).tile_kind(2, 0)
