// kv_rows.cuh — where key/value row j of a request lives, and the tile loads that follow it.
//
// Two storages, chosen at compile time: RAGGED (row j at base + j * token_stride, one contiguous
// run per request) and PAGED (row j in page pages[j >> page_shift], slot j & (page_size - 1):
// base + page * page_stride + slot * token_stride). `base` already points at the KV head's first
// element, so NHD and HND pages, and K and V in separate or combined buffers, differ only in the
// strides the host passes. The page table was validated on the host, so every page id is in range.
// A paged tile's page ids can be staged in shared memory one tile ahead (stage_page_ids_async),
// so that the K/V copies of a tile never wait for a page-table read from global memory.
// Requires: common.cuh, mma.cuh (cp_async_16), smem_tile.cuh.

template <typename T, bool PAGED>
struct KvRows {
  const T* base;        // ragged: the request's row 0; paged: the KV head's offset inside page 0
  i64_t token_stride;   // elements between consecutive tokens (within a page when paged)
  const int* pages;     // paged: the request's page ids, in token order
  i64_t page_stride;    // paged: elements between consecutive pages
  int page_shift;       // paged: log2(page_size)
  int page_mask;        // paged: page_size - 1

  __device__ __forceinline__ const T* row(int j) const {
    if constexpr (PAGED) {
      return in_page(__ldg(pages + (j >> page_shift)), j);
    } else {
      return base + j * token_stride;
    }
  }

  // Paged: row j, which lies in page `page`.
  __device__ __forceinline__ const T* in_page(int page, int j) const {
    return base + page * page_stride + (j & page_mask) * token_stride;
  }
};

// Loads rows [j0, j0 + ROWS) of `src` into `tile`; rows at or past `valid_rows` (relative to j0)
// are zero-filled and their addresses never formed (a paged row past the end has no page).
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, typename T, bool PAGED>
__device__ __forceinline__ void load_kv_rows_async(const SmemTile<ROW_CHUNKS>& tile, const KvRows<T, PAGED>& src,
                                                   int j0, int valid_rows) {
  if constexpr (!PAGED) {
    load_rows_async<ROWS, ROW_CHUNKS, NUM_THREADS, T>(tile, src.base + j0 * src.token_stride, src.token_stride,
                                                      valid_rows);
  } else {
    load_tile_async<ROWS, ROW_CHUNKS, NUM_THREADS, T>(tile, [&](int row, bool& valid) {
      valid = row < valid_rows;
      return valid ? src.row(j0 + row) : src.base;
    });
  }
}

// Paged: copies the page id of each of the ROWS key rows from j0 (ROWS ints) to shared memory
// at `ids`, asynchronously (part of the caller's cp.async group); rows past `valid_rows` get 0.
// Ragged rows have no page: nothing to stage.
template <int ROWS, int NUM_THREADS, typename T, bool PAGED>
__device__ __forceinline__ void stage_page_ids_async(u32_t ids, const KvRows<T, PAGED>& src, int j0, int valid_rows) {
  if constexpr (!PAGED) return;
  for (int i = threadIdx.x; i < ROWS; i += NUM_THREADS) {
    const bool valid = i < valid_rows;
    cp_async_4(ids + 4 * i, valid ? src.pages + ((j0 + i) >> src.page_shift) : src.pages, valid);
  }
}

// Rows [j0, j0 + ROWS) into `tile` as load_kv_rows_async does; paged rows take their page ids
// from the shared-memory stage at `ids` (filled by stage_page_ids_async for the same j0).
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, typename T, bool PAGED>
__device__ __forceinline__ void load_kv_rows_staged_async(const SmemTile<ROW_CHUNKS>& tile, const KvRows<T, PAGED>& src,
                                                          u32_t ids, int j0, int valid_rows) {
  if constexpr (PAGED) {
    load_tile_async<ROWS, ROW_CHUNKS, NUM_THREADS, T>(tile, [&](int row, bool& valid) {
      valid = row < valid_rows;
      return valid ? src.in_page(ld_shared_s32(ids + 4 * row), j0 + row) : src.base;
    });
  } else {
    load_kv_rows_async<ROWS, ROW_CHUNKS, NUM_THREADS>(tile, src, j0, valid_rows);
  }
}
