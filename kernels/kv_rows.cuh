// kv_rows.cuh — where key/value row j of a request lives, and the tile loads that follow it.
//
// Two storages, chosen at compile time: RAGGED (row j at base + j * token_stride, one contiguous
// run per request) and PAGED (row j in page pages[j >> page_shift], slot j & (page_size - 1):
// base + page * page_stride + slot * token_stride). `base` already points at the KV head's first
// element, so NHD and HND pages, and K and V in separate or combined buffers, differ only in the
// strides the host passes. The page table was validated on the host, so every page id is in range.
// A paged tile's page ids can be staged in shared memory one tile ahead (stage_page_ids_async),
// so that the K/V copies of a tile never wait for a page-table read from global memory. The main
// loop copies the K and V rows of a tile together (load_kv_tiles_staged_async): paged, each row's
// page id, slot and validity serve both, and each thread's pointer arithmetic is set up once per
// CTA (PagedKvThread).
// fp8 pages (FP8 = KV_FP8_E4M3 or KV_FP8_E5M2, paged only) hold one-byte codes: a tile's codes
// are copied by cp.async like any rows (copy_fp8_codes_async), then expanded in place into the
// tile's T by the threads that copied them (expand_fp8_codes, fp8.cuh), so the products
// downstream read an f16/bf16 tile as ever: dequantised, or decoded exactly with the scale left
// for the caller to apply to the products.
// Requires: common.cuh, mma.cuh (cp_async_16, cp_async_4, st_shared_16, ld_shared_s32), smem_tile.cuh,
// fp8.cuh.

template <typename T, bool PAGED, int FP8 = KV_FP8_NONE>
struct KvRows {
  static_assert(FP8 == KV_FP8_NONE || PAGED, "fp8 K/V live in a paged cache");
  // The cache's element: T, or a byte of fp8 code.
  using Elem = typename Select<FP8 == KV_FP8_NONE, T, unsigned char>::type;
  const Elem* base;     // ragged: the request's row 0; paged: the KV head's offset inside page 0
  i64_t token_stride;   // elements between consecutive tokens (within a page when paged)
  const int* pages;     // paged: the request's page ids, in token order
  i64_t page_stride;    // paged: elements between consecutive pages
  int page_shift;       // paged: log2(page_size)
  int page_mask;        // paged: page_size - 1
  float scale;          // fp8: the dequantisation scale of this KV head (unused otherwise)

  __device__ __forceinline__ const Elem* row(int j) const {
    if constexpr (PAGED) {
      return in_page(__ldg(pages + (j >> page_shift)), j);
    } else {
      return base + j * token_stride;
    }
  }

  // Paged: row j, which lies in page `page`.
  __device__ __forceinline__ const Elem* in_page(int page, int j) const {
    return base + page * page_stride + (j & page_mask) * token_stride;
  }
};

// The K or V scale of KV head `head` (`head_stride` 0: one per tensor, 1: one per head); 1 without
// fp8, the pointer then unread.
template <int FP8>
__device__ __forceinline__ float kv_scale(const float* scales, int head_stride, int head) {
  if constexpr (FP8 == KV_FP8_NONE) {
    return 1.0f;
  } else {
    return __ldg(scales + head * head_stride);
  }
}

// fp8 tiles arrive in two steps, so that the global reads overlap the computation like any other
// copy: copy_fp8_codes_async copies a tile's codes by cp.async into the buffer that will hold its
// dequantised rows, and expand_fp8_codes, once the copying thread's own copies have landed,
// dequantises them in place (fp8.cuh). Each 16-byte run of codes (16 elements) goes to the first
// of the two 16-byte tile chunks its elements become, and the thread that copied it is the one
// that expands it into both: no other thread reads or writes those bytes in between, so the
// expansion needs no barrier of its own. Rows at or past the valid rows are zero-filled by the
// copy, codes that dequantise to zeros. The expanded rows are published by the barrier (and, for
// wgmma, the proxy fence of wait_copies) that precedes the tile's products.
//
// Thread `tid` takes runs tid, tid + NUM_THREADS, ... of the tile's rows in order (run c of row r
// is index r * CODE_RUNS + c), so the threads of a warp read whole rows of consecutive bytes. The
// copies are unrolled (their addresses are cheap to keep); the expansion only with
// policy::FP8_EXPAND_UNROLLED (after the tile's products it runs beside the live accumulators).
//
// Where a run waits in the buffer (Fp8CodeSlots): when 32 runs are whole rows (head dims 64, 128,
// 256), the 32 runs of each warp's copy go to the first 512 bytes, in address order, of the 1024
// their rows expand into (either layout), so a warp's copies fill whole 128-byte lines of shared
// memory as a plain tile's do (at the expanded chunks, every other 16 bytes, each copy moved its
// 32-byte sector from L2 twice and the decode kernel was bound by L2 requests: `ncu --set full`
// on the e4m3 decode, L2 tag requests at 84% of peak, DRAM at 47%). Those rows are expanded by
// the same warp, whose lanes read their runs, meet at a warp barrier, then write. Otherwise (head dim 192) a run waits at the first of its two chunks, where
// only its own thread reads or writes.
template <int ROWS, int CODE_RUNS, int NUM_THREADS, bool UNROLLED, typename F>
__device__ __forceinline__ void for_thread_code_runs(F f) {
  constexpr int TOTAL = ROWS * CODE_RUNS;
  constexpr int RUNS = (TOTAL + NUM_THREADS - 1) / NUM_THREADS;
  auto run = [&](int i) {
    const int idx = i * NUM_THREADS + threadIdx.x;
    if (TOTAL % NUM_THREADS == 0 || idx < TOTAL) f(idx / CODE_RUNS, idx % CODE_RUNS);
  };
  if constexpr (UNROLLED) {
#pragma unroll
    for (int i = 0; i < RUNS; ++i) run(i);
  } else {
#pragma unroll 1
    for (int i = 0; i < RUNS; ++i) run(i);
  }
}

// The byte offset of run `run` (of 8) within code row `row`'s 128 bytes at head dim 128: the run
// XOR 2 * ((row / 4) % 4) XOR 4 * (row % 2), so that the runs a quarter-warp reads at once in
// prefill_fp8_fragments.cuh (the same run of rows 4 apart, and runs 0-3 of two neighbouring rows)
// sit at different banks. A permutation of each row's runs: the copy still fills whole lines.
template <typename Index>
__device__ __forceinline__ u32_t fp8_code_run_at(Index row, Index run) {
  const u32_t r = static_cast<u32_t>(row);
  return ((static_cast<u32_t>(run) ^ ((r >> 1) & 6u) ^ ((r & 1u) << 2)) & 7u) * 16u;
}

// The shared-memory address of run `run` of code row `row` of a codes-only buffer at `base`
// (Fp8CodeSlots' DENSE rows, which prefill_fp8_fragments.cuh reads): row r at r * 128, its runs
// swizzled by fp8_code_run_at.
template <typename Index>
__device__ __forceinline__ u32_t fp8_code_run_addr(u32_t base, Index row, Index run) {
  return base + static_cast<u32_t>(row * 128) + fp8_code_run_at(row, run);
}

// Where the copy puts run `run` of row `row` and expand_fp8_codes reads it (see above). DENSE:
// the buffer holds the codes alone, never expanded (policy::FP8_FRAGMENTS at head dim 128, whose
// products read them in place): code row r at r * 128, its runs swizzled by fp8_code_run_at.
template <int ROW_CHUNKS, int ATOM_ROWS, bool DENSE = false>
struct Fp8CodeSlots {
  static constexpr int CODE_RUNS = ROW_CHUNKS / 2;
  // Runs of one warp's copy packed in order: whole rows per 32 runs.
  static constexpr bool PACKED = 32 % CODE_RUNS == 0;
  // The rows of one warp's 32 runs, and the 16-byte slots of those rows in one column group of
  // the column layout.
  static constexpr int WARP_ROWS = PACKED ? 32 / CODE_RUNS : 1;
  static constexpr int GROUP_SLOTS = WARP_ROWS * 8;
  static_assert(!DENSE || (ATOM_ROWS == 0 && CODE_RUNS == 8), "dense codes: rows of 128 codes in the row layout");
  // Head dim 128: the distance between the slots of rows r and r + 16 (16 rows of the row
  // layout's 256-byte rows, of a column's 128-byte rows, or of dense 128-byte code rows; the
  // swizzle of fp8_code_run_at depends on the row's low four bits only).
  static constexpr u32_t ROWS16_BYTES = ATOM_ROWS == 0 && !DENSE ? 16 * 256 : 16 * 128;
  // (Index: int, or u32_t, as SmemTile::chunk_addr takes it.)
  template <typename Index>
  __device__ __forceinline__ static u32_t at(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile, Index row, Index run) {
    if constexpr (DENSE) {
      return fp8_code_run_addr(tile.base, row, run);
    } else if constexpr (PACKED) {
      // Slot s of the warp's 32 is the s-th 16 bytes, in address order, of what its rows expand
      // into: row-major, 1024 contiguous bytes; in the column layout, the rows' 128-byte lines of
      // column group 0, then of group 1 (head dim 256: two rows, 16 slots a group).
      const Index idx = row * CODE_RUNS + run;
      const Index slot = idx % 32;
      if constexpr (ATOM_ROWS == 0 && CODE_RUNS == 8) {
        // Four rows of 128 codes: row r at (r / 4) * 1024 + (r % 4) * 128, its runs swizzled
        // (fp8_code_run_at) for the direct fragment reads of prefill_fp8_fragments.cuh.
        return tile.base + static_cast<u32_t>((row / 4) * 1024 + (row % 4) * 128) + fp8_code_run_at(row, run);
      } else if constexpr (ATOM_ROWS == 0) {
        return tile.base + static_cast<u32_t>((idx / 32) * 1024 + slot * 16);
      } else {
        const Index first_row = (idx / 32) * WARP_ROWS;
        return tile.base + static_cast<u32_t>((slot / GROUP_SLOTS) * SmemTile<ROW_CHUNKS, ATOM_ROWS>::GROUP_BYTES +
                                              first_row * 128 + (slot % GROUP_SLOTS) * 16);
      }
    } else {
      return tile.chunk_addr(row, 2 * run);
    }
  }
};

// fp8: the codes of one tensor's rows [j0, j0 + ROWS) to `tile` (part of the caller's cp.async
// group), each 16-byte run where expand_fp8_codes finds it (Fp8CodeSlots; DENSE as there);
// `page_of(row)` is the page id of the tile's row `row` (any id when the row is past the valid
// rows).
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, bool DENSE = false, typename T, int FP8, int ATOM_ROWS,
          typename PageOf>
__device__ __forceinline__ void copy_fp8_codes_async(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile,
                                                     const KvRows<T, true, FP8>& src, int j0, int valid_rows,
                                                     PageOf page_of) {
  static_assert(ROW_CHUNKS % 2 == 0, "fp8 rows of whole 16-code runs");
  for_thread_code_runs<ROWS, ROW_CHUNKS / 2, NUM_THREADS, true>([&](int row, int run) {
    cp_async_16(Fp8CodeSlots<ROW_CHUNKS, ATOM_ROWS, DENSE>::at(tile, row, run), src.in_page(page_of(row), j0 + row) + 16 * run,
                row < valid_rows);
  });
}

// fp8: the codes of the K and V rows [j0, j0 + ROWS) (one cp.async group for the caller to
// commit), their page ids read from the stage at `ids` (stage_page_ids_async, as for other
// pages). With equal head dims a thread's K and V runs are the same rows and columns: one page id
// serves both.
template <int ROWS, int K_CHUNKS, int V_CHUNKS, int NUM_THREADS, bool DENSE = false, typename T, int FP8,
          int ATOM_ROWS>
__device__ __forceinline__ void copy_fp8_kv_codes_async(const SmemTile<K_CHUNKS, ATOM_ROWS>& k_tile,
                                                        const SmemTile<V_CHUNKS, ATOM_ROWS>& v_tile,
                                                        const KvRows<T, true, FP8>& k, const KvRows<T, true, FP8>& v,
                                                        u32_t ids, int j0, int valid_rows) {
  auto staged = [&](int row) { return ld_shared_s32(ids + 4 * row); };
  if constexpr (K_CHUNKS == V_CHUNKS) {
    for_thread_code_runs<ROWS, K_CHUNKS / 2, NUM_THREADS, true>([&](int row, int run) {
      const bool valid = row < valid_rows;
      const int page = staged(row);
      using Slots = Fp8CodeSlots<K_CHUNKS, ATOM_ROWS, DENSE>;
      cp_async_16(Slots::at(k_tile, row, run), k.in_page(page, j0 + row) + 16 * run, valid);
      cp_async_16(Slots::at(v_tile, row, run), v.in_page(page, j0 + row) + 16 * run, valid);
    });
  } else {
    copy_fp8_codes_async<ROWS, K_CHUNKS, NUM_THREADS, DENSE>(k_tile, k, j0, valid_rows, staged);
    copy_fp8_codes_async<ROWS, V_CHUNKS, NUM_THREADS, DENSE>(v_tile, v, j0, valid_rows, staged);
  }
}

// fp8: the codes this thread copied into `tile` (copy_fp8_codes_async, landed) expanded in place
// (an unrolled loop when UNROLLED): dequantised with `scale`, or with SCALE_LATER decoded exactly
// and `scale` unread (the caller applies it to the products). Each run's 16 codes become its two
// tile chunks, the second half's codes read before the first chunk overwrites them, each half
// converted and stored on its own (fewer live registers beside the accumulators).
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, typename T, int FP8, bool UNROLLED, bool SCALE_LATER, int ATOM_ROWS>
__device__ __forceinline__ void expand_fp8_codes(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile, float scale) {
  auto expand = [&](uint2 codes) {
    return SCALE_LATER ? decode_fp8x8<T, FP8>(codes) : dequantize_fp8x8<T, FP8>(codes, scale);
  };
  using Slots = Fp8CodeSlots<ROW_CHUNKS, ATOM_ROWS>;
  if constexpr (Slots::PACKED) {
    // Packed runs: every lane of the warp reads its run, the warp meets, then each writes its two
    // chunks (over bytes where other lanes' runs waited). Every lane meets the warp barrier, a
    // lane without a run too.
    static_assert(NUM_THREADS % 32 == 0, "whole warps");
    constexpr int TOTAL = ROWS * Slots::CODE_RUNS;
    // In the rolled loop, unsigned indices: their divisions by the powers of two here are then
    // shifts and masks, where signed ones each took a sign fix-up (the loop's body 56 -> 40
    // instructions in the e4m3 head-dim-128 two-warpgroup kernel, sm_90a SASS). Unrolled, ptxas
    // knows the signed ones are not negative, and the unsigned ones scheduled longer.
    using Index = typename Select<UNROLLED, int, u32_t>::type;
    auto step = [&](int i) {
      const Index idx = static_cast<Index>(i * NUM_THREADS + threadIdx.x);
      const bool has_run = TOTAL % NUM_THREADS == 0 || idx < static_cast<Index>(TOTAL);
      const Index row = idx / Slots::CODE_RUNS, run = idx % Slots::CODE_RUNS;
      uint2 lo = make_uint2(0u, 0u), hi = make_uint2(0u, 0u);
      if (has_run) {
        const u32_t at = Slots::at(tile, row, run);
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(lo.x), "=r"(lo.y) : "r"(at) : "memory");
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(hi.x), "=r"(hi.y) : "r"(at + 8) : "memory");
      }
      __syncwarp();
      if (has_run) {
        st_shared_16(tile.chunk_addr(row, 2 * run), expand(lo));
        st_shared_16(tile.chunk_addr(row, 2 * run + 1), expand(hi));
      }
    };
    constexpr int STEPS = (TOTAL + NUM_THREADS - 1) / NUM_THREADS;
    if constexpr (UNROLLED) {
#pragma unroll
      for (int i = 0; i < STEPS; ++i) step(i);
    } else {
#pragma unroll 1
      for (int i = 0; i < STEPS; ++i) step(i);
    }
    return;
  }
  for_thread_code_runs<ROWS, ROW_CHUNKS / 2, NUM_THREADS, UNROLLED>([&](int row, int run) {
    const u32_t lo_at = tile.chunk_addr(row, 2 * run);
    uint2 lo, hi;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(lo.x), "=r"(lo.y) : "r"(lo_at));
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(hi.x), "=r"(hi.y) : "r"(lo_at + 8));
    st_shared_16(lo_at, expand(lo));
    st_shared_16(tile.chunk_addr(row, 2 * run + 1), expand(hi));
  });
}

// Loads rows [j0, j0 + ROWS) of `src` into `tile`; rows at or past `valid_rows` (relative to j0)
// are zero-filled and their addresses never formed (a paged row past the end has no page).
// DENSE_CODES: fp8 codes go to a codes-only buffer (Fp8CodeSlots).
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, bool DENSE_CODES = false, typename T, bool PAGED, int ATOM_ROWS,
          int FP8>
__device__ __forceinline__ void load_kv_rows_async(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile,
                                                   const KvRows<T, PAGED, FP8>& src, int j0, int valid_rows) {
  if constexpr (FP8 != KV_FP8_NONE) {
    copy_fp8_codes_async<ROWS, ROW_CHUNKS, NUM_THREADS, DENSE_CODES>(tile, src, j0, valid_rows, [&](int row) {
      return row < valid_rows ? __ldg(src.pages + ((j0 + row) >> src.page_shift)) : 0;
    });
  } else if constexpr (!PAGED) {
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
template <int ROWS, int NUM_THREADS, typename T, bool PAGED, int FP8>
__device__ __forceinline__ void stage_page_ids_async(u32_t ids, const KvRows<T, PAGED, FP8>& src, int j0,
                                                     int valid_rows) {
  if constexpr (!PAGED) return;
  // Unrolled (one step when ROWS <= NUM_THREADS); a row past the end forms its page-table
  // pointer but cp.async reads none of it.
#pragma unroll
  for (int k = 0; k < (ROWS + NUM_THREADS - 1) / NUM_THREADS; ++k) {
    const int i = k * NUM_THREADS + threadIdx.x;
    if (ROWS % NUM_THREADS == 0 || i < ROWS) {
      // j0 + i >= 0: an unsigned shift, and the entry's address as one wide multiply-add.
      const u32_t entry = static_cast<u32_t>(j0 + i) >> src.page_shift;
      cp_async_4(ids + 4 * i, reinterpret_cast<const int*>(mad_wide_u32(entry, 4, reinterpret_cast<u64_t>(src.pages))),
                 i < valid_rows);
    }
  }
}

// How the main loop's copies (ragged and paged) share out a tile: 8 threads to a row. Thread
// `tid` takes chunks c, c + 8, .. (c = tid % 8) of rows row0 + i * ROWS_PER_PASS (row0 = tid / 8).
// The 8 threads of a row read 128 contiguous bytes per copy instruction, so a warp still reads
// whole 128-byte lines (four rows' worth; with one thread per chunk of a 256-byte row it read two
// rows), and the 8 chunks an instruction writes to a tile row land on distinct swizzle positions
// (no bank conflict). A thread's chunks of one row sit 128 bytes apart in global memory and a
// fixed distance apart in the tile (128 bytes in the row layout, a column in wgmma's; the swizzle
// changes only the low 3 bits of the chunk index), so one source pointer and one shared-memory
// address serve them all, the rest at immediate offsets: a thread addresses ROW_CHUNKS / 8 times
// fewer rows than with one chunk per thread. (A thread chunk of (tid % 8) ^ (row0 % 8), which
// makes its tile address linear, saved 3 instructions per tile but made ptxas serialize the
// wgmma of the causal D=128 two-warpgroup kernels: `attnforge compile --log` shows it.)
template <int NUM_THREADS>
struct RowSplit {
  static_assert(NUM_THREADS % 8 == 0, "whole rows of 8 threads");
  static constexpr int ROWS_PER_PASS = NUM_THREADS / 8;  // tiles of a multiple of this many rows
  int row0, chunk0;

  __device__ __forceinline__ RowSplit() : row0(threadIdx.x / 8), chunk0(threadIdx.x % 8) {}

  __device__ __forceinline__ int row(int i) const { return row0 + i * ROWS_PER_PASS; }

  // Where chunk c of the thread's i-th row goes. With whole groups of 8 rows per pass every row
  // of the thread has the same swizzle: one address plus constants.
  template <int ROW_CHUNKS, int ATOM_ROWS>
  __device__ __forceinline__ u32_t dst(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile, int i) const {
    return ROWS_PER_PASS % 8 == 0 ? tile.chunk_addr(row0, chunk0) +
                                        static_cast<u32_t>(i * ROWS_PER_PASS * SmemTile<ROW_CHUNKS, ATOM_ROWS>::ROW_BYTES)
                                  : tile.chunk_addr(row(i), chunk0);
  }
};

// One thread's copies of one row (RowSplit): chunks c, c + 8, .. from `src` (chunk c of the row)
// to `dst` (where chunk c goes), 128 bytes apart in global memory and GROUP_BYTES apart in the
// tile; zeros when `valid` is false.
template <int ROW_CHUNKS, int GROUP_BYTES>
__device__ __forceinline__ void copy_row_chunks_async(u32_t dst, const char* src, bool valid) {
#pragma unroll
  for (int s = 0; s < ROW_CHUNKS / 8; ++s) cp_async_16(dst + GROUP_BYTES * s, src + 128 * s, valid);
}

// The byte strides of a paged tensor: u32_t when both fit 32 bits, else u64_t.
template <typename Bytes>
struct PageStrides {
  Bytes page_bytes, token_bytes;
};

// `base` + row * row_bytes: one wide multiply-add when the stride is u32_t. Rows are
// non-negative (a key index, or a page id validated on the host): an unsigned product.
template <typename Bytes>
__device__ __forceinline__ const char* row_chunk(const char* base, u32_t row, Bytes row_bytes) {
  if constexpr (sizeof(Bytes) == 4) {
    return reinterpret_cast<const char*>(mad_wide_u32(row, row_bytes, reinterpret_cast<u64_t>(base)));
  } else {
    return base + static_cast<u64_t>(row) * row_bytes;
  }
}

// Paged: `base` + page * page_bytes + slot * token_bytes.
template <typename Bytes>
__device__ __forceinline__ const char* paged_chunk(const char* base, u32_t page, u32_t slot, PageStrides<Bytes> s) {
  return row_chunk(row_chunk(base, page, s.page_bytes), slot, s.token_bytes);
}

// One thread's K and V base pointers for the main loop's copies (its chunk c of key row 0, or of
// slot 0 of page 0), kept in 16 bytes of shared memory at `addr`: written once per work item and
// read back by the same thread in each tile. Kept in registers, ptxas recomputes them from the
// kernel parameters in every tile instead (about 20 instructions per tile at sm_90a).
struct KvBaseStash {
  u32_t addr;

  __device__ __forceinline__ KvBaseStash(u32_t stash_base, const char* k_base, const char* v_base)
      : addr(stash_base + 16 * threadIdx.x) {
    asm volatile("st.shared.v2.u64 [%0], {%1, %2};" ::"r"(addr), "l"(k_base), "l"(v_base));
  }

  __device__ __forceinline__ void bases(const char*& k_base, const char*& v_base) const {
    asm volatile("ld.shared.v2.u64 {%0, %1}, [%2];" : "=l"(k_base), "=l"(v_base) : "r"(addr));
  }
};

// The thread's chunk c (RowSplit) of row 0 of `rows`.
template <typename T, bool PAGED, int NUM_THREADS>
__device__ __forceinline__ const char* thread_chunk0(const KvRows<T, PAGED>& rows) {
  return reinterpret_cast<const char*>(rows.base) + RowSplit<NUM_THREADS>().chunk0 * 16;
}

// Paged K and V as one thread of the main loop's copies (RowSplit) sees them, formed once per CTA:
// the byte strides, the copy path they allow, and the thread's base pointers. K and V share the
// page table and the page size; the host passes only strides, so NHD and HND pages and separate
// or combined K/V buffers all come here the same way. Paths (uniform, fixed per launch):
// - NARROW: every byte stride fits 32 bits (any realistic cache): u32_t products. WIDE: u64_t.
// - NARROW_SAME: NARROW, and K and V have the same strides (the usual case: only the bases
//   differ). V is then given K's strides, so each row's page and slot products serve both.
// The base pointers (the thread's chunk c of slot 0 of page 0 in K and in V) live in a
// KvBaseStash.
template <typename T, int NUM_THREADS>
struct PagedKvThread {
  enum Path { NARROW_SAME, NARROW, WIDE };
  PageStrides<u64_t> k_bytes, v_bytes;
  int page_mask;
  Path path;
  KvBaseStash stash;

  __device__ __forceinline__ PagedKvThread(const KvRows<T, true>& k, const KvRows<T, true>& v, u32_t stash_base)
      : k_bytes{static_cast<u64_t>(k.page_stride) * sizeof(T), static_cast<u64_t>(k.token_stride) * sizeof(T)},
        v_bytes{static_cast<u64_t>(v.page_stride) * sizeof(T), static_cast<u64_t>(v.token_stride) * sizeof(T)},
        page_mask(k.page_mask),
        stash(stash_base, thread_chunk0<T, true, NUM_THREADS>(k), thread_chunk0<T, true, NUM_THREADS>(v)) {
    const bool narrow =
        ((k_bytes.page_bytes | k_bytes.token_bytes | v_bytes.page_bytes | v_bytes.token_bytes) >> 32) == 0;
    const bool same = k_bytes.page_bytes == v_bytes.page_bytes && k_bytes.token_bytes == v_bytes.token_bytes;
    path = !narrow ? WIDE : same ? NARROW_SAME : NARROW;
  }

  __device__ __forceinline__ static PageStrides<u32_t> narrowed(const PageStrides<u64_t>& b) {
    return {static_cast<u32_t>(b.page_bytes), static_cast<u32_t>(b.token_bytes)};
  }
};

// One thread's copies (RowSplit) of the K and V rows [j0, j0 + ROWS) of one key tile: for its
// i-th row (the tile's row `row`), `chunks(i, row, k, v)` sets the thread's first chunk in K and
// in V. Rows at or past valid_rows (none when WHOLE) are zero-filled: their pointers are formed
// but cp.async reads none of them. CODES: the rows are fp8 codes of head dim 128, whose 8 runs
// a row are RowSplit's 8 chunks: the thread's one run of the row goes where Fp8CodeSlots puts it
// (DENSE as there).
template <int ROWS, bool WHOLE, int K_CHUNKS, int V_CHUNKS, int NUM_THREADS, int ATOM_ROWS, bool CODES = false,
          bool DENSE = false, typename RowChunks>
__device__ __forceinline__ void copy_kv_rows(const SmemTile<K_CHUNKS, ATOM_ROWS>& k_tile,
                                             const SmemTile<V_CHUNKS, ATOM_ROWS>& v_tile, int valid_rows,
                                             RowChunks chunks) {
  using Split = RowSplit<NUM_THREADS>;
  const Split split;
  static_assert(!CODES || (K_CHUNKS == 16 && V_CHUNKS == 16 && Split::ROWS_PER_PASS % 16 == 0),
                "codes: 8 runs a row, passes of whole 16-row blocks");
  // Codes: the thread's rows are 16k rows apart, so their slots are k ROWS16_BYTES apart.
  using KSlots = Fp8CodeSlots<K_CHUNKS, ATOM_ROWS, DENSE>;
  using VSlots = Fp8CodeSlots<V_CHUNKS, ATOM_ROWS, DENSE>;
  const u32_t k_codes0 = CODES ? KSlots::at(k_tile, split.row0, split.chunk0) : 0u;
  const u32_t v_codes0 = CODES ? VSlots::at(v_tile, split.row0, split.chunk0) : 0u;
#pragma unroll
  for (int i = 0; i < ROWS / Split::ROWS_PER_PASS; ++i) {
    const int row = split.row(i);
    const char *k, *v;
    chunks(i, row, k, v);
    const bool valid = WHOLE || row < valid_rows;
    if constexpr (CODES) {
      cp_async_16(k_codes0 + i * (Split::ROWS_PER_PASS / 16) * KSlots::ROWS16_BYTES, k, valid);
      cp_async_16(v_codes0 + i * (Split::ROWS_PER_PASS / 16) * VSlots::ROWS16_BYTES, v, valid);
    } else {
      copy_row_chunks_async<K_CHUNKS, SmemTile<K_CHUNKS, ATOM_ROWS>::GROUP_BYTES>(split.dst(k_tile, i), k, valid);
      copy_row_chunks_async<V_CHUNKS, SmemTile<V_CHUNKS, ATOM_ROWS>::GROUP_BYTES>(split.dst(v_tile, i), v, valid);
    }
  }
}

// Ragged K and V as one thread of the main loop's copies (RowSplit) sees them, formed once per
// work item: the byte strides between tokens, whether both fit 32 bits (narrow: each row pointer
// is one wide multiply-add; otherwise u64_t products), and the thread's base pointers (its chunk
// c of the request's key row 0 in K and in V, in a KvBaseStash). Before, each tile formed every
// row's pointer from the kernel parameters with 64-bit arithmetic (about 30 instructions per
// tensor and tile at sm_90a).
template <typename T, int NUM_THREADS>
struct RaggedKvThread {
  u64_t k_bytes, v_bytes;
  bool narrow;
  KvBaseStash stash;

  __device__ __forceinline__ RaggedKvThread(const KvRows<T, false>& k, const KvRows<T, false>& v, u32_t stash_base)
      : k_bytes(static_cast<u64_t>(k.token_stride) * sizeof(T)),
        v_bytes(static_cast<u64_t>(v.token_stride) * sizeof(T)),
        narrow(((k_bytes | v_bytes) >> 32) == 0),
        stash(stash_base, thread_chunk0<T, false, NUM_THREADS>(k), thread_chunk0<T, false, NUM_THREADS>(v)) {}
};

// Ragged: copy_kv_rows with byte strides `k_bytes` and `v_bytes` (u32_t on the narrow path).
template <int ROWS, bool WHOLE, int K_CHUNKS, int V_CHUNKS, typename T, int NUM_THREADS, typename Bytes, int ATOM_ROWS>
__device__ __forceinline__ void load_ragged_kv_pass(const SmemTile<K_CHUNKS, ATOM_ROWS>& k_tile,
                                                    const SmemTile<V_CHUNKS, ATOM_ROWS>& v_tile,
                                                    const RaggedKvThread<T, NUM_THREADS>& src, Bytes k_bytes,
                                                    Bytes v_bytes, int j0, int valid_rows) {
  const char *k_base, *v_base;
  src.stash.bases(k_base, v_base);
  copy_kv_rows<ROWS, WHOLE, K_CHUNKS, V_CHUNKS, NUM_THREADS>(
      k_tile, v_tile, valid_rows, [&](int, int row, const char*& k, const char*& v) {
        const u32_t j = static_cast<u32_t>(j0 + row);
        k = row_chunk(k_base, j, k_bytes);
        v = row_chunk(v_base, j, v_bytes);
      });
}

// Paged: copy_kv_rows with byte strides `k_bytes` and `v_bytes` (CODES: of fp8 codes). K and V rows of a tile are the
// same tokens, so each row's page id (read from the stage at `ids`), slot and validity serve
// both; each tensor then forms one pointer per row from the thread's base pointer. A row past
// the end has page id 0 in the stage (stage_page_ids_async), so its pointer is well formed.
template <int ROWS, bool WHOLE, bool CODES, bool DENSE, int K_CHUNKS, int V_CHUNKS, typename T, int NUM_THREADS,
          typename Bytes, int ATOM_ROWS>
__device__ __forceinline__ void load_paged_kv_pass(const SmemTile<K_CHUNKS, ATOM_ROWS>& k_tile,
                                                   const SmemTile<V_CHUNKS, ATOM_ROWS>& v_tile,
                                                   const PagedKvThread<T, NUM_THREADS>& src, PageStrides<Bytes> k_bytes,
                                                   PageStrides<Bytes> v_bytes, u32_t ids, int j0, int valid_rows) {
  using Split = RowSplit<NUM_THREADS>;
  constexpr int PASSES = ROWS / Split::ROWS_PER_PASS;
  const Split split;
  // The page ids first, then the copies (fewer shared-load/cp.async alternations).
  u32_t page[PASSES];
#pragma unroll
  for (int i = 0; i < PASSES; ++i) page[i] = static_cast<u32_t>(ld_shared_s32(ids + 4 * split.row(i)));
  const char *k_base, *v_base;
  src.stash.bases(k_base, v_base);
  copy_kv_rows<ROWS, WHOLE, K_CHUNKS, V_CHUNKS, NUM_THREADS, ATOM_ROWS, CODES, DENSE>(
      k_tile, v_tile, valid_rows, [&](int i, int row, const char*& k, const char*& v) {
        const u32_t slot = static_cast<u32_t>((j0 + row) & src.page_mask);
        k = paged_chunk(k_base, page[i], slot, k_bytes);
        v = paged_chunk(v_base, page[i], slot, v_bytes);
      });
}

// Paged, when RowSplit does not split the tile evenly: rows [j0, j0 + ROWS) of one tensor, one
// page-id read per chunk.
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, typename T, int ATOM_ROWS>
__device__ __forceinline__ void load_paged_rows_any_async(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile,
                                                          const KvRows<T, true>& src, u32_t ids, int j0,
                                                          int valid_rows) {
  load_tile_async<ROWS, ROW_CHUNKS, NUM_THREADS, T>(tile, [&](int row, bool& valid) {
    valid = row < valid_rows;
    return valid ? src.in_page(ld_shared_s32(ids + 4 * row), j0 + row) : src.base;
  });
}

// The K and V rows of a request (KvRows each) and, paged, one thread's view of both for the main
// loop's copies (PagedKvThread; its stash at `stash_base` takes NUM_THREADS * 16 bytes of shared
// memory), formed once per CTA. fp8 (this primary template): the rows, and the thread's view of
// their codes' bytes (head dim 128 copies by it; copy_fp8_kv_codes_async forms every address
// of the others).
template <typename T, bool PAGED, int NUM_THREADS, int FP8 = KV_FP8_NONE>
struct KvSource {
  static_assert(PAGED, "fp8 K/V live in a paged cache");
  KvRows<T, PAGED, FP8> k, v;
  PagedKvThread<unsigned char, NUM_THREADS> paged;

  __device__ __forceinline__ static KvRows<unsigned char, true> codes(const KvRows<T, PAGED, FP8>& r) {
    return {r.base, r.token_stride, r.pages, r.page_stride, r.page_shift, r.page_mask, r.scale};
  }
  __device__ __forceinline__ KvSource(const KvRows<T, PAGED, FP8>& k_rows, const KvRows<T, PAGED, FP8>& v_rows,
                                      u32_t stash_base)
      : k(k_rows), v(v_rows), paged(codes(k_rows), codes(v_rows), stash_base) {}
};

template <typename T, int NUM_THREADS>
struct KvSource<T, true, NUM_THREADS, KV_FP8_NONE> {
  KvRows<T, true> k, v;
  PagedKvThread<T, NUM_THREADS> paged;

  __device__ __forceinline__ KvSource(const KvRows<T, true>& k_rows, const KvRows<T, true>& v_rows, u32_t stash_base)
      : k(k_rows), v(v_rows), paged(k_rows, v_rows, stash_base) {}
};

template <typename T, int NUM_THREADS>
struct KvSource<T, false, NUM_THREADS, KV_FP8_NONE> {
  KvRows<T, false> k, v;
  RaggedKvThread<T, NUM_THREADS> ragged;

  __device__ __forceinline__ KvSource(const KvRows<T, false>& k_rows, const KvRows<T, false>& v_rows, u32_t stash_base)
      : k(k_rows), v(v_rows), ragged(k_rows, v_rows, stash_base) {}
};

// The K and V rows [j0, j0 + ROWS) of one key tile into `k_tile` and `v_tile` (one cp.async group
// for the caller to commit), as load_kv_rows_async does for each; paged rows take their page ids
// from the shared-memory stage at `ids` (filled by stage_page_ids_async for the same j0).
// DENSE_CODES: fp8 codes go to codes-only buffers (Fp8CodeSlots).
template <int ROWS, int K_CHUNKS, int V_CHUNKS, int NUM_THREADS, bool DENSE_CODES = false, typename T, bool PAGED,
          int ATOM_ROWS, int FP8>
__device__ __forceinline__ void load_kv_tiles_staged_async(const SmemTile<K_CHUNKS, ATOM_ROWS>& k_tile,
                                                           const SmemTile<V_CHUNKS, ATOM_ROWS>& v_tile,
                                                           const KvSource<T, PAGED, NUM_THREADS, FP8>& src, u32_t ids,
                                                           int j0, int valid_rows) {
  // fp8 codes at head dim 128 take the pages' path below (8 runs a row, RowSplit's chunks).
  constexpr bool CODES = FP8 != KV_FP8_NONE && K_CHUNKS == 16 && V_CHUNKS == 16;
  if constexpr (FP8 != KV_FP8_NONE && !(CODES && ROWS % RowSplit<NUM_THREADS>::ROWS_PER_PASS == 0)) {
    copy_fp8_kv_codes_async<ROWS, K_CHUNKS, V_CHUNKS, NUM_THREADS, DENSE_CODES>(k_tile, v_tile, src.k, src.v, ids, j0,
                                                                                 valid_rows);
  } else if constexpr (PAGED && ROWS % RowSplit<NUM_THREADS>::ROWS_PER_PASS == 0) {
    // Uniform branches: a whole tile (every tile but a request's last) compares no row; on the
    // same-stride path V is given K's strides.
    using Thread = typename Select<CODES, PagedKvThread<unsigned char, NUM_THREADS>, PagedKvThread<T, NUM_THREADS>>::type;
    const Thread& p = src.paged;
    const PageStrides<u32_t> k32 = Thread::narrowed(p.k_bytes), v32 = Thread::narrowed(p.v_bytes);
    const bool whole = valid_rows >= ROWS;
    if (whole && p.path == Thread::NARROW_SAME) {
      load_paged_kv_pass<ROWS, true, CODES, DENSE_CODES>(k_tile, v_tile, p, k32, k32, ids, j0, valid_rows);
    } else if (p.path != Thread::WIDE) {
      load_paged_kv_pass<ROWS, false, CODES, DENSE_CODES>(k_tile, v_tile, p, k32, v32, ids, j0, valid_rows);
    } else {
      load_paged_kv_pass<ROWS, false, CODES, DENSE_CODES>(k_tile, v_tile, p, p.k_bytes, p.v_bytes, ids, j0, valid_rows);
    }
  } else if constexpr (PAGED) {
    load_paged_rows_any_async<ROWS, K_CHUNKS, NUM_THREADS>(k_tile, src.k, ids, j0, valid_rows);
    load_paged_rows_any_async<ROWS, V_CHUNKS, NUM_THREADS>(v_tile, src.v, ids, j0, valid_rows);
  } else if constexpr (ROWS % RowSplit<NUM_THREADS>::ROWS_PER_PASS == 0) {
    // Uniform branches, as above: a whole tile compares no row.
    const RaggedKvThread<T, NUM_THREADS>& r = src.ragged;
    if (r.narrow) {
      const u32_t k32 = static_cast<u32_t>(r.k_bytes), v32 = static_cast<u32_t>(r.v_bytes);
      if (valid_rows >= ROWS) {
        load_ragged_kv_pass<ROWS, true>(k_tile, v_tile, r, k32, v32, j0, valid_rows);
      } else {
        load_ragged_kv_pass<ROWS, false>(k_tile, v_tile, r, k32, v32, j0, valid_rows);
      }
    } else {
      load_ragged_kv_pass<ROWS, false>(k_tile, v_tile, r, r.k_bytes, r.v_bytes, j0, valid_rows);
    }
  } else {
    load_kv_rows_async<ROWS, K_CHUNKS, NUM_THREADS, DENSE_CODES>(k_tile, src.k, j0, valid_rows);
    load_kv_rows_async<ROWS, V_CHUNKS, NUM_THREADS, DENSE_CODES>(v_tile, src.v, j0, valid_rows);
  }
}
