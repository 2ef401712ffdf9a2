"""Tree attention: masks, position ids and KV pruning for a forward over a draft subtree.

A tree forward runs several branches of one prefix in a single query. Query row ``i`` sees the whole cache
(the committed prefix) and, among the new rows, only its own root-to-node path; its position id is the
prefix length plus its depth. Its logits then equal those of a sequential forward of that path.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def path_matrix(parent: list[int]) -> torch.Tensor:
    """[q, q] bool: row ``i`` marks ``i`` and its ancestors. ``parent[i] < i`` indexes the query, -1 at a root."""
    q = len(parent)
    on_path = torch.eye(q, dtype=torch.bool)  # [q, q]
    for i, p in enumerate(parent):
        if p >= 0:
            on_path[i] |= on_path[p]
    return on_path


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, device=None) -> torch.Tensor:
    """[q, P+q] bool visibility -> [1, 1, q, P+q] float mask, 0 where visible and -inf elsewhere."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill(~visible.to(device), float("-inf"))[None, None]


def tree_mask(parent: list[int], past_len: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """[1, 1, q, past+q] mask of a tree query over a cache of ``past_len`` committed positions."""
    q = len(parent)
    visible = torch.ones(q, past_len + q, dtype=torch.bool)  # [q, P+q]
    visible[:, past_len:] = path_matrix(parent)
    return additive_mask(visible, dtype, device)


def tree_positions(depth: list[int], past_len: int, device=None) -> torch.Tensor:
    """[1, q] position ids: the committed prefix length plus each row's depth below the root."""
    return (torch.tensor(depth, device=device) + past_len)[None]


def keep_rows(cache: DynamicCache, past_len: int, rows: list[int]) -> None:
    """Keep the committed prefix and, after it, only the tree rows ``rows`` (ascending): drops rejected rows.

    Only the kept rows move (to positions ``past_len, past_len + 1, ...``); the prefix is not copied.
    """
    if rows != list(range(len(rows))):  # else they already sit where they belong
        for layer in cache.layers:
            src = torch.tensor(rows, device=layer.keys.device) + past_len  # [m]
            end = past_len + len(rows)
            layer.keys[..., past_len:end, :] = layer.keys.index_select(-2, src)  # [B, H, m, D]
            layer.values[..., past_len:end, :] = layer.values.index_select(-2, src)
    crop(cache, past_len + len(rows))


def crop(cache: DynamicCache, length: int) -> None:
    """Cut the cache back to its first ``length`` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
