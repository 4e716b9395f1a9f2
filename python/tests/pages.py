"""Paged KV caches for the CPU tests: random pages in a shuffled order with their page table,
and the check of the rows ``append_paged_kv_cache`` wrote into one."""

import numpy as np

from reference import gather_pages

rng = np.random.default_rng()


def shuffled_cache(kv_lens, page_size, hkv, d, layout, combined, fill):
    """A cache of pages ``fill(shape)`` in a shuffled order (a few pages unused) for requests of
    ``kv_lens`` keys: ``(cache, (k, v), ids, indptr, last)``, the cache one ``[pages, 2, ...]``
    array when ``combined``, else the ``(k, v)`` pair; ``(k, v)`` its K/V views; ``ids``,
    ``indptr``, ``last`` its page table (int32)."""
    pages_per = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages_per) + 3
    ids = rng.permutation(num_pages)[: sum(pages_per)].astype(np.int32)
    indptr = np.cumsum([0] + pages_per).astype(np.int32)
    last = np.array([n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per)], np.int32)
    page = (page_size, hkv, d) if layout == "NHD" else (hkv, page_size, d)
    if combined:
        kv = fill((num_pages, 2) + page)
        return kv, (kv[:, 0], kv[:, 1]), ids, indptr, last
    k, v = fill((num_pages,) + page), fill((num_pages,) + page)
    return (k, v), (k, v), ids, indptr, last


def check_appended(views, before, table, old, new, appended):
    """Checks an NHD cache after an append: request ``r`` keeps its first ``old[r]`` rows
    (``before``: copies of the K/V ``views`` taken before) and holds the next ``new[r]`` rows of
    ``appended`` (the appended ``(k, v)``, requests in order) after them. ``table``:
    ``(ids, indptr, last)``."""
    ids, indptr, last = table
    start = 0
    for r in range(len(old)):
        now = gather_pages(*views, indptr, ids, last, r, "NHD")
        then = gather_pages(*before, indptr, ids, last, r, "NHD")
        for x, x0, x_new in zip(now, then, appended):
            np.testing.assert_array_equal(x[: old[r]], x0[: old[r]])
            np.testing.assert_array_equal(x[old[r] :], x_new[start : start + new[r]])
        start += new[r]
