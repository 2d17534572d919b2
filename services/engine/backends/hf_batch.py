"""The running batch of the transformers backend: one KV cache for every sequence.

Continuous batching without paged attention, as TGI's `CausalLMBatch` does it:
the sequences' caches are stacked along the batch dimension and aligned on the
right, shorter ones padded on the left; an attention mask says which columns
are real and each sequence's position ids count only its own tokens, so the
model computes for every row exactly what it would for that sequence alone
(greedy text is the same, tested).

    columns  0 1 2 3 4 5            mask       positions of the next token
    seq a    k k k k k k            1 1 1 1 1 1     6
    seq b    . . k k k k            0 0 1 1 1 1     4
    seq c    . . . . k k            0 0 0 0 1 1     2

`add` pads and concatenates (a join, or a sequence coming back), `keep`
selects rows and trims columns that are padding in every remaining row (a
finish, a cancel, a sequence held out), `take` cuts one row back to its own
length (its cache while it waits outside the batch). Everything here runs on
the decode thread only.

Why not one cache per sequence, stacked per step only when lengths match:
lengths almost never match (every prompt differs), so that would decode one
sequence per forward pass, which is what this replaces. Why not transformers'
`generate()` with a padded batch: it cannot take a sequence in or out between
steps. Why not a paged cache: transformers' paged attention ("continuous
batching" in `generate_batch`) owns its own scheduler and is not a step we can
drive; the padding here costs memory (a padded row holds columns it never
attends to) and is trimmed as the longest sequences leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@dataclass
class RowCache:
    """One sequence's cache out of the batch: per layer (keys, values), each
    [1, heads, length, head_dim], with no padding."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    # The cache object these came from, when the row is a whole cache: a batch
    # of one uses it as it is (whatever its layers' kind) instead of copying.
    source: Any = None

    @property
    def length(self) -> int:
        return int(self.layers[0][0].shape[-2])

    @classmethod
    def from_cache(cls, cache: Any) -> RowCache:
        return cls([(layer.keys, layer.values) for layer in cache.layers], source=cache)


def batchable(cache: Any) -> bool:
    """Whether a model's cache is made of plain growing layers, the only kind
    whose rows we can pad and cut (a sliding-window layer keeps state of its own)."""
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class PaddedBatch:
    """Rows of sequences in one DynamicCache, aligned on the right (see the module doc)."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [rows, columns], long: 1 real, 0 padding

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    def add(self, rows: list[RowCache]) -> None:
        """Append rows at the end of the batch (in this order)."""
        if not rows:
            return
        if self.cache is None and len(rows) == 1 and rows[0].source is not None:
            self.cache = rows[0].source
            self.mask = torch.ones(1, rows[0].length, dtype=torch.long,
                                   device=rows[0].layers[0][0].device)
            return
        width = max([self.columns, *(r.length for r in rows)])
        device = rows[0].layers[0][0].device
        masks = [] if self.mask is None else [_pad_left(self.mask, width - self.columns, 1)]
        masks += [_pad_left(torch.ones(1, r.length, dtype=torch.long, device=device),
                            width - r.length, 1) for r in rows]
        if self.cache is None:
            self.cache = DynamicCache()
            own: list[tuple[torch.Tensor, torch.Tensor]] = []
        else:
            own = [(layer.keys, layer.values) for layer in self.cache.layers]
        layers = []
        for index in range(len(rows[0].layers)):
            parts_k = [] if not own else [_pad_left(own[index][0], width - self.columns, 2)]
            parts_v = [] if not own else [_pad_left(own[index][1], width - self.columns, 2)]
            for r in rows:
                k, v = r.layers[index]
                parts_k.append(_pad_left(k, width - r.length, 2))
                parts_v.append(_pad_left(v, width - r.length, 2))
            layers.append((torch.cat(parts_k, dim=0), torch.cat(parts_v, dim=0)))
        self._set(layers)
        self.mask = torch.cat(masks, dim=0)

    def keep(self, indices: list[int]) -> None:
        """Keep these rows (in this order), drop the rest and the columns that
        are now padding in every row."""
        if not indices:
            self.cache = self.mask = None
            return
        assert self.mask is not None
        if indices == list(range(self.rows)):
            return
        select = torch.tensor(indices, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, select)
        first = int(mask.any(dim=0).long().argmax())  # the first column some row uses
        self.mask = mask[:, first:]
        self._set([(layer.keys.index_select(0, select)[:, :, first:],
                    layer.values.index_select(0, select)[:, :, first:])
                   for layer in self.cache.layers])

    def take(self, index: int) -> RowCache:
        """Row `index`'s cache without its padding (the batch is unchanged)."""
        assert self.mask is not None
        if self.rows == 1:  # the whole cache, as it is: the batch drops it next
            return RowCache.from_cache(self.cache)
        first = self.columns - int(self.mask[index].sum())
        return RowCache([(layer.keys[index:index + 1, :, first:].clone(),
                          layer.values[index:index + 1, :, first:].clone())
                         for layer in self.cache.layers])

    def grow(self) -> torch.Tensor:
        """The mask for a step that feeds one new token to every row; kept as the batch's."""
        assert self.mask is not None
        ones = torch.ones(self.rows, 1, dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        return self.mask

    def _set(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        cache = self.cache
        while len(cache.layers) < len(layers):
            cache.layers.append(DynamicLayer())
        for layer, (k, v) in zip(cache.layers, layers, strict=False):
            if not layer.is_initialized:
                layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v


def _pad_left(t: torch.Tensor, count: int, dim: int) -> torch.Tensor:
    if count == 0:
        return t
    shape = list(t.shape)
    shape[dim] = count
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)
