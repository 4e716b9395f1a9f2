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
  // Unrolled (one step when ROWS <= NUM_THREADS); a row past the end forms its page-table
  // pointer but cp.async reads none of it.
#pragma unroll
  for (int k = 0; k < (ROWS + NUM_THREADS - 1) / NUM_THREADS; ++k) {
    const int i = k * NUM_THREADS + threadIdx.x;
    if (ROWS % NUM_THREADS == 0 || i < ROWS) {
      cp_async_4(ids + 4 * i, src.pages + ((j0 + i) >> src.page_shift), i < valid_rows);
    }
  }
}

// The copies of one thread in load_kv_rows_staged_async's paged path: rows row0, row0 +
// ROWS_PER_PASS, .. at its chunk, each at chunk_base + page * page_bytes + slot * token_bytes.
// Stride is u32_t when both byte strides fit (then each term is one wide multiply-add) or
// u64_t.
template <int ROWS, int ROWS_PER_PASS, typename Stride, int ROW_CHUNKS>
__device__ __forceinline__ void load_paged_rows_pass(const SmemTile<ROW_CHUNKS>& tile, int row0, int chunk,
                                                     const char* chunk_base, Stride page_bytes, Stride token_bytes,
                                                     int page_mask, u32_t ids, int j0, int valid_rows) {
  const u32_t dst0 = tile.chunk_addr(row0, chunk);
  // The page ids first, then the copies (fewer shared-load/cp.async alternations).
  u32_t page[ROWS / ROWS_PER_PASS];
#pragma unroll
  for (int i = 0; i < ROWS / ROWS_PER_PASS; ++i) {
    // Page ids are in range (validated on the host), so non-negative: unsigned products.
    page[i] = static_cast<u32_t>(ld_shared_s32(ids + 4 * (row0 + i * ROWS_PER_PASS)));
  }
#pragma unroll
  for (int i = 0; i < ROWS / ROWS_PER_PASS; ++i) {
    const int row = row0 + i * ROWS_PER_PASS;
    const u32_t slot = static_cast<u32_t>((j0 + row) & page_mask);
    const char* p;
    if constexpr (sizeof(Stride) == 4) {
      // Two wide multiply-adds, in this order (the compiler's own association costs ~3 more).
      p = reinterpret_cast<const char*>(
          mad_wide_u32(slot, token_bytes, mad_wide_u32(page[i], page_bytes, reinterpret_cast<u64_t>(chunk_base))));
    } else {
      p = chunk_base + static_cast<u64_t>(page[i]) * page_bytes + static_cast<u64_t>(slot) * token_bytes;
    }
    const u32_t dst = ROWS_PER_PASS % 8 == 0 ? dst0 + static_cast<u32_t>(i * ROWS_PER_PASS * ROW_CHUNKS * 16)
                                             : tile.chunk_addr(row, chunk);
    cp_async_16(dst, p, row < valid_rows);
  }
}

// Rows [j0, j0 + ROWS) into `tile` as load_kv_rows_async does; paged rows take their page ids
// from the shared-memory stage at `ids` (filled by stage_page_ids_async for the same j0). When
// a thread's rows all sit at one chunk (NUM_THREADS a multiple of ROW_CHUNKS), it forms one
// pointer per row from a pointer to its chunk of page 0 and one shared-memory address per row
// group: no per-chunk select (a row past the end has page id 0 in the stage, so its pointer is
// well formed, and cp.async reads none of it).
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, typename T, bool PAGED>
__device__ __forceinline__ void load_kv_rows_staged_async(const SmemTile<ROW_CHUNKS>& tile, const KvRows<T, PAGED>& src,
                                                          u32_t ids, int j0, int valid_rows) {
  if constexpr (PAGED && NUM_THREADS % ROW_CHUNKS == 0) {
    constexpr int ELEMS_PER_CHUNK = 16 / sizeof(T);
    constexpr int ROWS_PER_PASS = NUM_THREADS / ROW_CHUNKS;
    static_assert(ROWS % ROWS_PER_PASS == 0, "tile rows must split evenly over passes");
    const int row0 = threadIdx.x / ROW_CHUNKS, chunk = threadIdx.x % ROW_CHUNKS;
    const char* chunk_base = reinterpret_cast<const char*>(src.base + chunk * ELEMS_PER_CHUNK);
    const u64_t page_bytes = src.page_stride * sizeof(T), token_bytes = src.token_stride * sizeof(T);
    if (((page_bytes | token_bytes) >> 32) == 0) {
      load_paged_rows_pass<ROWS, ROWS_PER_PASS>(tile, row0, chunk, chunk_base, static_cast<u32_t>(page_bytes),
                                                static_cast<u32_t>(token_bytes), src.page_mask, ids, j0, valid_rows);
    } else {
      load_paged_rows_pass<ROWS, ROWS_PER_PASS>(tile, row0, chunk, chunk_base, page_bytes, token_bytes, src.page_mask,
                                                ids, j0, valid_rows);
    }
  } else if constexpr (PAGED) {
    load_tile_async<ROWS, ROW_CHUNKS, NUM_THREADS, T>(tile, [&](int row, bool& valid) {
      valid = row < valid_rows;
      return valid ? src.in_page(ld_shared_s32(ids + 4 * row), j0 + row) : src.base;
    });
  } else {
    load_kv_rows_async<ROWS, ROW_CHUNKS, NUM_THREADS>(tile, src, j0, valid_rows);
  }
}
