"""FlashInfer's page-table helpers and ``append_paged_kv_cache`` (new tokens' K and V written
into their pages, fp8 caches included), re-exported by ``attnforge.flashinfer``."""

from . import _arrays as A
from . import _fp8
from . import _native
from ._options import refuse


def _check_kv_layout(kv_layout):
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f'invalid kv_layout: is {kv_layout!r}; expected "NHD" or "HND"')


def _kv_indptr(page_indptr, last_page_len, page_size):
    """Token prefix sums of the requests of a page table (for the custom mask's offsets)."""
    out = [0]
    for r in range(len(page_indptr) - 1):
        pages = page_indptr[r + 1] - page_indptr[r]
        n = 0 if pages <= 0 else (pages - 1) * page_size + last_page_len[r]
        out.append(out[-1] + n)
    return out


def append_paged_kv_cache(
    append_key,
    append_value,
    batch_indices,
    positions,
    paged_kv_cache,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
    kv_layout="NHD",
    *,
    kv_data_type=None,
):
    """Writes new tokens' K and V (``[nnz, Hkv, D]``) into the paged cache. The page table is
    the one after the append; token ``i`` goes to request ``batch_indices[i]`` at position
    ``positions[i]``. attnforge appends each request's new tokens as its last positions, in
    order (as ``get_batch_indices_positions`` lays them out); other placements raise
    ``NotImplementedError``. Into an fp8 cache the rows are fp8 codes of its type, copied as
    FlashInfer copies them (``kv_data_type``, an attnforge extension, names the format of a
    numpy ``uint8`` cache)."""
    _check_kv_layout(kv_layout)
    fp8 = _fp8.cache_format(paged_kv_cache, kv_data_type)
    page_indptr = A.int_list(kv_indptr, "kv_indptr")
    last = A.int_list(kv_last_page_len, "kv_last_page_len")
    batch = A.int_list(batch_indices, "batch_indices")
    pos = A.int_list(positions, "positions")
    if len(batch) != len(pos):
        raise ValueError(
            f"invalid positions: has {len(pos)} entries; batch_indices has {len(batch)}"
        )
    first = paged_kv_cache[0] if isinstance(paged_kv_cache, (tuple, list)) else paged_kv_cache
    if fp8 is None:
        A.checked_dtype(first, "paged_kv_cache")
    shape = first.shape
    page_size = shape[-2] if kv_layout == "HND" else shape[-3]
    kv_lens = _kv_indptr(page_indptr, last, page_size)
    counts = [0] * (len(page_indptr) - 1)
    for b in batch:
        if not 0 <= b < len(counts):
            raise ValueError(f"invalid batch_indices: request {b} is outside 0..{len(counts)}")
        counts[b] += 1
    append_indptr = [0]
    for c in counts:
        append_indptr.append(append_indptr[-1] + c)
    for i, (b, p) in enumerate(zip(batch, pos)):
        kv_len = kv_lens[b + 1] - kv_lens[b]
        expected = kv_len - counts[b] + (i - append_indptr[b])
        if i < append_indptr[b] or i >= append_indptr[b + 1] or p != expected:
            refuse(
                "positions",
                f"token {i}: request {b}, position {p}",
                "attnforge appends each request's new tokens, grouped by request and in order,"
                " as its last positions",
            )
    # The kernel reads whole rows of new tokens: a strided slice of a CUDA tensor is copied into
    # rows first, on the caller's stream (the append launches on it too).
    if fp8 is not None:
        append_key = _fp8.append_rows(append_key, "append_key", fp8)
        append_value = _fp8.append_rows(append_value, "append_value", fp8)
    append_key, append_value = (
        x.contiguous() if A.is_torch(x) and not x.is_contiguous() else x
        for x in (append_key, append_value)
    )
    _native.append_paged_kv(
        append_key,
        append_value,
        append_indptr,
        paged_kv_cache,
        kv_layout,
        page_indptr,
        A.int_list(kv_indices, "kv_indices"),
        last,
        A.current_stream(A.device_of(append_key)),
        fp8,
    )


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """Keys per request of a page table: ``max(pages - 1, 0) * page_size + last_page_len``."""
    return (kv_indptr[1:] - kv_indptr[:-1] - 1).clip(min=0) * page_size + kv_last_page_len


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """For each of the ``nnz`` new tokens of a ragged batch (``append_indptr``), its request and
    its position: request ``r``'s new tokens are the last ones of its ``seq_lens[r]`` keys.
    Returns int32 ``(batch_indices, positions)`` like ``append_indptr``."""
    indptr = A.int_list(append_indptr, "append_indptr")
    lens = A.int_list(seq_lens, "seq_lens")
    if len(lens) != len(indptr) - 1:
        raise ValueError(
            f"invalid seq_lens: has {len(lens)} entries; append_indptr describes"
            f" {len(indptr) - 1} requests"
        )
    batch, positions = [], []
    for r in range(len(lens)):
        n = indptr[r + 1] - indptr[r]
        batch += [r] * n
        positions += range(lens[r] - n, lens[r])
    if len(batch) != nnz:
        raise ValueError(f"invalid nnz: is {nnz}; append_indptr holds {len(batch)} tokens")
    return A.int32_array(append_indptr, batch), A.int32_array(append_indptr, positions)
