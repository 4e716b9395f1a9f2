// smem_tile.cuh — swizzled shared-memory tiles of rows of 16-byte chunks.
//
// A tile row holds one token's head vector: ROW_CHUNKS chunks of 8 elements (16 bytes). Chunk c
// of row r is stored at position (c ^ (r % 8)) within its group of 8 chunks, so the 8 rows an
// ldmatrix reads at one logical chunk hit 8 distinct 16-byte bank groups: no bank conflicts.
// ROW_CHUNKS must be a multiple of 8 (head dims 64, 128, 192, 256 are). Two layouts of the groups:
// - ATOM_ROWS = 0: row-major, row r at r * ROW_CHUNKS * 16 bytes (the mma.sync kernels');
// - ATOM_ROWS = the tile's rows: column-major in groups, chunks 8g.. of every row in column g of
//   ATOM_ROWS * 128 bytes, row r at r * 128 within it: wgmma's 128-byte swizzled layout, each
//   column one K-major (or N-major) operand of 64 elements per row.
// With 8 chunks a row (head dim 64) both are the same.
// Requires: mma.cuh (smem_addr, cp_async_16).

template <int ROW_CHUNKS, int ATOM_ROWS = 0>
struct SmemTile {
  static_assert(ROW_CHUNKS % 8 == 0, "rows must span whole groups of 8 chunks for the swizzle");
  static_assert(ATOM_ROWS % 8 == 0, "the column layout: whole 8-row swizzle periods");
  // Bytes between consecutive rows, and between chunk c and chunk c + 8 of a row.
  static constexpr int ROW_BYTES = ATOM_ROWS > 0 ? 128 : ROW_CHUNKS * 16;
  static constexpr int GROUP_BYTES = ATOM_ROWS > 0 ? ATOM_ROWS * 128 : 128;
  u32_t base;  // shared-memory address of chunk 0 of row 0

  // (Index: int, or u32_t where the caller's indices are unsigned, whose / and % by 8 are shifts
  // and masks rather than signed divisions.)
  template <typename Index>
  __device__ __forceinline__ u32_t chunk_addr(Index row, Index chunk) const {
    if constexpr (ATOM_ROWS > 0) {
      return base + static_cast<u32_t>(row * ROW_BYTES + (chunk / 8) * GROUP_BYTES + ((chunk % 8) ^ (row & 7)) * 16);
    } else {
      return base + static_cast<u32_t>((row * ROW_CHUNKS + (chunk ^ (row & 7))) * 16);
    }
  }
};

// Where one thread's ldmatrix rows sit in a swizzled tile (either layout), as one offset computed
// once. A warp's ldmatrix reads rows row0 + r and chunks chunk0 + c, where r and c (c in {0, 1})
// are the thread's own and row0 (a multiple of 8) and chunk0 (even) are compile-time constants
// once the caller's loops are unrolled. The swizzle changes only the low 3 bits of the chunk
// index, so (chunk0 + c) ^ (r & 7) = (chunk0 & ~7) + ((c ^ (r & 7)) ^ (chunk0 % 8)): the thread's
// offset for chunk0 % 8 == 0, XORed with (chunk0 % 8) * 16 (bits 5..6: the row term is a multiple
// of 128 bytes), plus a constant the load takes as an immediate. No per-read swizzle in the main
// loop.
template <int ROW_CHUNKS, int ATOM_ROWS = 0>
struct FragOffsets {
  using Tile = SmemTile<ROW_CHUNKS, ATOM_ROWS>;
  u32_t off;  // bytes from the tile base to (row r, chunk c ^ (r & 7))

  __device__ __forceinline__ FragOffsets(int r, int c)
      : off(static_cast<u32_t>((r * (Tile::ROW_BYTES / 16) + (c ^ (r & 7))) * 16)) {}

  // The address Tile{base}.chunk_addr(row0 + r, chunk0 + c) (row0 % 8 == 0, chunk0 even; any
  // chunk0 when c is 0).
  __device__ __forceinline__ u32_t at(u32_t base, int row0, int chunk0) const {
    return base + (off ^ static_cast<u32_t>((chunk0 % 8) * 16)) +
           static_cast<u32_t>((row0 * (Tile::ROW_BYTES / 16) + (chunk0 & ~7) * (Tile::GROUP_BYTES / 128)) * 16);
  }
};

// Loads ROWS rows of a [tokens, heads, dim] tensor into `tile` with cp.async, NUM_THREADS
// threads cooperating. `row_src(row, valid)` returns the global address of the row's first
// element and sets `valid` (false: zero-fill).
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, typename T, typename RowSource, int ATOM_ROWS>
__device__ __forceinline__ void load_tile_async(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile, RowSource row_src) {
  static_assert((ROWS * ROW_CHUNKS) % NUM_THREADS == 0, "tile must split evenly over threads");
  constexpr int ELEMS_PER_CHUNK = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < ROWS * ROW_CHUNKS / NUM_THREADS; ++i) {
    int idx = i * NUM_THREADS + threadIdx.x;
    int row = idx / ROW_CHUNKS, chunk = idx % ROW_CHUNKS;
    bool valid;
    const T* src = row_src(row, valid);
    cp_async_16(tile.chunk_addr(row, chunk), src + chunk * ELEMS_PER_CHUNK, valid);
  }
}

// The copies of load_rows_async of one thread: its chunk of rows row0, row0 + ROWS_PER_PASS, ..
// from `src` on, stepping `step` elements; WHOLE: every row is valid (no compare).
template <int ROWS, int ROWS_PER_PASS, bool WHOLE, int ROW_CHUNKS, typename T, int ATOM_ROWS>
__device__ __forceinline__ void load_rows_pass(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile, int row0, int chunk,
                                               const T* src, i64_t step, int valid_rows) {
  // With whole groups of 8 rows per pass, every row of the thread has the same swizzle: one
  // shared-memory address plus constants.
  const u32_t dst0 = tile.chunk_addr(row0, chunk);
#pragma unroll
  for (int i = 0; i < ROWS / ROWS_PER_PASS; ++i) {
    const int row = row0 + i * ROWS_PER_PASS;
    const u32_t dst = ROWS_PER_PASS % 8 == 0
                          ? dst0 + static_cast<u32_t>(i * ROWS_PER_PASS * SmemTile<ROW_CHUNKS, ATOM_ROWS>::ROW_BYTES)
                          : tile.chunk_addr(row, chunk);
    cp_async_16(dst, src, WHOLE || row < valid_rows);
    src += step;
  }
}

// Loads ROWS rows of a row-strided source (row r at first_row + r * row_stride elements) into
// `tile`; rows at or past `valid_rows` are zero-filled. Each thread keeps one source pointer and
// steps it by a uniform stride, so the K/V loads of a tile cost a few registers, not one address
// per chunk (which pushed the main loop into spills). The pointer of a zero-filled row is formed
// but never read (cp.async reads 0 bytes), so no select per chunk; a whole tile (the common case)
// takes no per-row compare either.
template <int ROWS, int ROW_CHUNKS, int NUM_THREADS, typename T, int ATOM_ROWS>
__device__ __forceinline__ void load_rows_async(const SmemTile<ROW_CHUNKS, ATOM_ROWS>& tile, const T* first_row,
                                                i64_t row_stride, int valid_rows) {
  constexpr int ELEMS_PER_CHUNK = 16 / sizeof(T);
  if constexpr (NUM_THREADS % ROW_CHUNKS == 0) {
    constexpr int ROWS_PER_PASS = NUM_THREADS / ROW_CHUNKS;
    static_assert(ROWS % ROWS_PER_PASS == 0, "tile rows must split evenly over passes");
    const int row0 = threadIdx.x / ROW_CHUNKS, chunk = threadIdx.x % ROW_CHUNKS;
    const T* src = first_row + row0 * row_stride + chunk * ELEMS_PER_CHUNK;
    const i64_t step = ROWS_PER_PASS * row_stride;
    if (valid_rows >= ROWS) {
      load_rows_pass<ROWS, ROWS_PER_PASS, true>(tile, row0, chunk, src, step, valid_rows);
    } else {
      load_rows_pass<ROWS, ROWS_PER_PASS, false>(tile, row0, chunk, src, step, valid_rows);
    }
  } else {
    load_tile_async<ROWS, ROW_CHUNKS, NUM_THREADS, T>(tile, [&](int row, bool& valid) {
      valid = row < valid_rows;
      return valid ? first_row + row * row_stride : first_row;
    });
  }
}
