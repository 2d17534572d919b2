"""The hf backend's padded batch: rows in, rows out, each row's cache intact."""

from __future__ import annotations

import importlib.util
import os

import pytest

if not importlib.util.find_spec("torch") or not importlib.util.find_spec("transformers"):
    if os.environ.get("STREAMLAB_WITH_HF") == "1":
        raise RuntimeError("STREAMLAB_WITH_HF=1 but torch/transformers are not installed")
    pytest.skip("the hf extra is not installed", allow_module_level=True)

import torch

from services.engine.backends.hf_batch import PaddedBatch, RowCache

LAYERS, HEADS, DIM = 2, 3, 4


def row(length: int, seed: int) -> RowCache:
    g = torch.Generator().manual_seed(seed)
    return RowCache([(torch.randn(1, HEADS, length, DIM, generator=g),
                      torch.randn(1, HEADS, length, DIM, generator=g)) for _ in range(LAYERS)])


def same(a: RowCache, b: RowCache) -> bool:
    return all(torch.equal(ka, kb) and torch.equal(va, vb)
               for (ka, va), (kb, vb) in zip(a.layers, b.layers, strict=True))


def test_rows_of_different_lengths_are_padded_on_the_left_and_come_back_whole() -> None:
    rows = [row(5, 0), row(2, 1), row(7, 2)]
    batch = PaddedBatch()
    batch.add(rows[:2])
    batch.add(rows[2:])
    assert (batch.rows, batch.columns) == (3, 7)
    assert batch.mask is not None
    assert batch.mask.sum(dim=1).tolist() == [5, 2, 7]
    assert batch.mask[1].tolist() == [0, 0, 0, 0, 0, 1, 1]  # right-aligned
    for i, r in enumerate(rows):
        assert same(batch.take(i), r)


def test_keeping_rows_trims_the_columns_no_row_uses() -> None:
    rows = [row(5, 0), row(2, 1), row(7, 2)]
    batch = PaddedBatch()
    batch.add(rows)
    batch.keep([1, 0])  # the longest leaves; order is the caller's
    assert (batch.rows, batch.columns) == (2, 5)
    assert same(batch.take(0), rows[1])
    assert same(batch.take(1), rows[0])
    batch.keep([])
    assert batch.rows == 0
    assert batch.cache is None


def test_a_step_grows_every_row_by_one_real_column() -> None:
    batch = PaddedBatch()
    batch.add([row(3, 0), row(1, 1)])
    mask = batch.grow()
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
