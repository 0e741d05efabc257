// Template of the fused streaming log-mel kernels (captioner_logmel_fused and
// captioner_logmel_packed). Not compilable as it stands: captioner/gpu/logmel_kernel.py
// (kernel_source) reads this file as package data, drops this header (everything up to and
// including the marker line below) and replaces each @NAME@ placeholder with generated text.
//
// Placeholders, and where their values come from:
//   @HISTORY@ @HOP@ @N_FFT@ @PAD@ @TILE@ @THREADS@ @WARPS@ @FRAME_STRIDE@ @PARK_STRIDE@
//   @WORK_FLOATS@ @N_LOAD@ @SEGMENT_FLOATS@  sizes and shared-memory layout (logmel_launch.py,
//                                           features_ref.py)
//   @N_MELS@ @N_SPK@ @LM_FIRST@             mel bands, the speaker encoder's bands (0 or 40),
//                                           and where both are parked in a frame's row
//                                           (logmel_kernel.py)
//   @TW1_TYPE@ @TABLES_IN_SHARED@ @LATE_BARRIER@ @MIN_BLOCKS@
//                                           per-precision choices ("float32" or "mixed")
//   @K5@ @S1@ @S2@ @R2@                     DFT-5 and DFT-8 constants, rounded once from float64
//   @CONSTANTS@                             the window and twiddle tables
//   @STAGE1@                                stage 1's unrolled DFT-25 and its W200 twiddles
//   @MEL_CASES@                             the mel filters (Whisper's, then the speaker
//                                           encoder's), one switch case per warp, with their
//                                           weights and bin slots written in
//
// The text below the marker began as what logmel_kernel.py held before it moved here; the
// speaker bands replaced the MFCC stage since. Where a comment names a Python helper: grids(),
// segment_floats() and _tables_in_shared (now tables_in_shared) are in logmel_launch.py; _park
// is in logmel_kernel.py.
// ---- end of header: the template starts on the next line ----

#define HISTORY @HISTORY@
#define HALF (N_FFT / 2)
#define HOP @HOP@
#define N_FFT @N_FFT@
#define PAD @PAD@
#define ROW (HOP + PAD)  // floats from one frame's samples to the next's in shared memory
#define TILE @TILE@
#define THREADS @THREADS@
#define WARPS @WARPS@
#define FS @FRAME_STRIDE@
#define N_MELS @N_MELS@
#define N_SPK @N_SPK@  // speaker encoder bands, parked after the log-mel (park(N_MELS + k))
#define TABLES_IN_SHARED @TABLES_IN_SHARED@
#define LM_FIRST @LM_FIRST@
#define PARK_STRIDE @PARK_STRIDE@  // floats from one row n1 of a frame to the next
#define WORK_FLOATS @WORK_FLOATS@  // the shared work area (tables, if in shared memory, follow)
#define N_LOAD @N_LOAD@  // samples of a full block: 31 hops and a window

@CONSTANTS@
__constant__ int g_segment_floats[TILE] = {0, @SEGMENT_FLOATS@};  // see segment_floats()

// Complex helpers for float2 and double2 (stage 1 is double2 in "mixed" precision).
template <typename C> __device__ __forceinline__ C cpx(decltype(C::x) x, decltype(C::x) y) { C r; r.x = x; r.y = y; return r; }
template <typename C> __device__ __forceinline__ C cadd(C a, C b) { return cpx<C>(a.x + b.x, a.y + b.y); }
template <typename C> __device__ __forceinline__ C csub(C a, C b) { return cpx<C>(a.x - b.x, a.y - b.y); }
template <typename C> __device__ __forceinline__ C mul_neg_i(C a) { return cpx<C>(a.y, -a.x); }  // -i a
__device__ __forceinline__ float fma_(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_(double a, double b, double c) { return fma(a, b, c); }
template <typename C, typename D> __device__ __forceinline__ C to(D a) { return cpx<C>(a.x, a.y); }
template <typename C> __device__ __forceinline__ C cmul(C a, C w) {
    return cpx<C>(fma_(a.x, w.x, -a.y * w.y), fma_(a.x, w.y, a.y * w.x));
}

// Forward DFT-5 in place. The cosine part in Winograd's form: (c1 + c2) / 2 = -1/4 exactly,
// so a near-constant input cancels exactly (a0 - t1 / 4) rather than through two rounded
// cosines (that cancellation was the largest float32 error on quiet bins of real speech).
template <typename C> __device__ __forceinline__ void dft5(C& a0, C& a1, C& a2, C& a3, C& a4) {
    typedef decltype(C::x) R;
    const R k = (R)@K5@, s1 = (R)@S1@, s2 = (R)@S2@, quarter = (R)0.25;
    const C s14 = cadd(a1, a4), d14 = csub(a1, a4), s23 = cadd(a2, a3), d23 = csub(a2, a3);
    const C t1 = cadd(s14, s23), t2 = csub(s14, s23);
    const C base = cpx<C>(fma_(-quarter, t1.x, a0.x), fma_(-quarter, t1.y, a0.y));
    const C r1 = cpx<C>(fma_(k, t2.x, base.x), fma_(k, t2.y, base.y));
    const C r2 = cpx<C>(fma_(-k, t2.x, base.x), fma_(-k, t2.y, base.y));
    const C u1 = cpx<C>(fma_(s1, d14.x, s2 * d23.x), fma_(s1, d14.y, s2 * d23.y));
    const C u2 = cpx<C>(fma_(s2, d14.x, -s1 * d23.x), fma_(s2, d14.y, -s1 * d23.y));
    a0 = cadd(a0, t1);
    a1 = cadd(r1, mul_neg_i(u1));
    a4 = csub(r1, mul_neg_i(u1));
    a2 = cadd(r2, mul_neg_i(u2));
    a3 = csub(r2, mul_neg_i(u2));
}

// Forward DFT-8 in place, natural order out (radix-2 over two DFT-4).
__device__ __forceinline__ void dft8(float2* a) {
    const float r2 = @R2@;
    const float2 t0 = cadd(a[0], a[4]), t1 = csub(a[0], a[4]);
    const float2 t2 = cadd(a[2], a[6]), t3 = mul_neg_i(csub(a[2], a[6]));
    const float2 t4 = cadd(a[1], a[5]), t5 = csub(a[1], a[5]);
    const float2 t6 = cadd(a[3], a[7]), t7 = mul_neg_i(csub(a[3], a[7]));
    const float2 e0 = cadd(t0, t2), e1 = cadd(t1, t3), e2 = csub(t0, t2), e3 = csub(t1, t3);
    const float2 o0 = cadd(t4, t6), o1 = cadd(t5, t7), o2 = csub(t4, t6), o3 = csub(t5, t7);
    const float2 w1 = make_float2(r2 * (o1.x + o1.y), r2 * (o1.y - o1.x));   // (1 - i)/sqrt2 * o1
    const float2 w2 = mul_neg_i(o2);
    const float2 w3 = make_float2(r2 * (o3.y - o3.x), -r2 * (o3.x + o3.y));  // (-1 - i)/sqrt2 * o3
    a[0] = cadd(e0, o0); a[4] = csub(e0, o0);
    a[1] = cadd(e1, w1); a[5] = csub(e1, w1);
    a[2] = cadd(e2, w2); a[6] = csub(e2, w2);
    a[3] = cadd(e3, w3); a[7] = csub(e3, w3);
}

// Z[k] + conj Z[200 - k] and the twiddled difference, for bin k: 4 |X[k]|^2, 4 |X[200 - k]|^2.
__device__ __forceinline__ float2 untangle(float2 zk, float2 zn, float2 tw) {
    const float2 e2 = make_float2(zk.x + zn.x, zk.y - zn.y);
    const float2 d2 = cmul(make_float2(zk.x - zn.x, zk.y + zn.y), tw);
    const float2 u = cadd(e2, d2), v = csub(e2, d2);
    return make_float2(fmaf(u.x, u.x, u.y * u.y), fmaf(v.x, v.x, v.y * v.y));
}

// Stage 2 for columns k2 and 25 - k2 of A[n1][k2] (row zf, slot 25 n1 + k2): two DFT-8 give
// Z[k2 + 25 j] and Z[25 - k2 + 25 j]; bins k = k2 + 25 j and 200 - k are untangled from
// Z[k2 + 25 j] and Z[25 - k2 + 25 (7 - j)] and written over the slot 25 j + k2 just read.
__device__ __forceinline__ void column_pair(float2* zf, const float2* c_tw2, int k2) {
    float2 a[8], b[8];
#pragma unroll
    for (int n1 = 0; n1 < 8; ++n1) { a[n1] = zf[25 * n1 + k2]; b[n1] = zf[25 * n1 + 25 - k2]; }
    dft8(a);
    dft8(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) zf[25 * j + k2] = untangle(a[j], b[7 - j], c_tw2[k2 + 25 * j]);
}

// Column 0 pairs with itself: Z[25 j] with Z[200 - 25 j] = Z[25 (8 - j)]; bins 25 j and
// 200 - 25 j for j = 1..4 (bins 0 and 200 have no mel weight).
__device__ __forceinline__ void column_zero(float2* zf, const float2* c_tw2) {
    float2 a[8];
#pragma unroll
    for (int n1 = 0; n1 < 8; ++n1) a[n1] = zf[25 * n1];
    dft8(a);
#pragma unroll
    for (int j = 1; j <= 4; ++j) zf[25 * j] = untangle(a[j], a[8 - j], c_tw2[25 * j]);
}

#if N_MELS % 4 == 0  // the copy-out moves VW bands at once (within one parking run of 24)
#define VW 4
typedef float4 VEC;
__device__ __forceinline__ float4 load_vec(const float* p) {
    const float2 a = *reinterpret_cast<const float2*>(p), b = *reinterpret_cast<const float2*>(p + 2);
    return make_float4(a.x, a.y, b.x, b.y);
}
#else
#define VW 2
typedef float2 VEC;
__device__ __forceinline__ float2 load_vec(const float* p) { return *reinterpret_cast<const float2*>(p); }
#endif

__device__ __forceinline__ int padded(int s) { return s + PAD * (s / HOP); }

// Float offset of parked value i (log-mel band, then speaker band) in a frame's row: see
// _park in logmel_kernel.py.
__device__ __forceinline__ int park(int i, int first) { return PARK_STRIDE * (i / 24) + first + i % 24; }

// A full block's N_LOAD samples, ext[160 j0 ..] of ext = history (360 = 90 float4) ++ new
// samples, into shared memory with the padding. 240 threads: float4 c of 160-sample block b + 6 u goes
// to float2 pair 81 (b + 6 u) + 2 c, so every address is a per-thread base plus a constant and
// six loads are in flight. Only a row's first tile (FIRST) reaches into the history.
template <bool FIRST> __device__ __forceinline__ void load_tile(
    float* xs, const float* h, const float* x_new, int j0)
{
    const int tid = threadIdx.x;
    if (tid >= 240) return;
    const int c = tid % 40, b = tid / 40;
    const int k0 = (HOP / 4) * j0 + 40 * b + c;  // float4 index in ext
    const float4* hist4 = reinterpret_cast<const float4*>(h);
    const float4* new4 = reinterpret_cast<const float4*>(x_new) - HISTORY / 4 + k0;
    float2* dst = reinterpret_cast<float2*>(xs) + (ROW / 2) * b + 2 * c;
#pragma unroll
    for (int u = 0; u < (TILE + 7) / 6; ++u) {
        if (40 * (b + 6 * u) + c < N_LOAD / 4) {
            const int k = k0 + 240 * u;
            const float4 v = (FIRST && k < HISTORY / 4) ? hist4[k] : new4[240 * u];
            dst[6 * (ROW / 2) * u] = make_float2(v.x, v.y);
            dst[6 * (ROW / 2) * u + 1] = make_float2(v.z, v.w);
        }
    }
}

// Samples of packed segments s = 0 .. nseg - 1 (rows r + s, frames j0 .. j0 + rem - 1 each)
// into shared memory, segment s at float seg * s, padded like a tile. float4 loads in flight
// four at a time; the segment of a float4 comes from a float reciprocal (exact: the quotient
// is at most 32 and never within 1e-3 of an integer). Rows still in their reflection (a
// stream's first frames, only when j0 == 0) get ext here too and are overwritten after a
// barrier (a check per float4 would put a dependent load before every sample load).
__device__ __forceinline__ void load_packed(
    float* xs, const float* samples, const long long* slots, const float* history,
    int r, int nseg, int j0, int rem, int seg, int n_new)
{
    const int l4 = (HOP * (rem - 1) + N_FFT) / 4;  // float4 per segment
    const float inv = 1.0f / (float)l4;
#pragma unroll 4
    for (int i = threadIdx.x; i < nseg * l4; i += THREADS) {
        const int s = (int)(((float)i + 0.5f) * inv);
        const int e4 = i - s * l4;
        const int row = r + s;
        const int e = HOP * j0 + 4 * e4;  // index in ext = history ++ new samples
        const float4 v = e >= HISTORY
            ? *reinterpret_cast<const float4*>(samples + (long long)row * n_new + (e - HISTORY))
            : *reinterpret_cast<const float4*>(history + slots[row] * HISTORY + e);
        float2* dst = reinterpret_cast<float2*>(xs + seg * s + 4 * e4 + PAD * (e4 / (HOP / 4)));
        dst[0] = make_float2(v.x, v.y);
        dst[1] = make_float2(v.z, v.w);
    }
}

// Sample i of a tile whose first frame is t0 = b0 - 1 + j0 (< 2: it reaches the reflection
// p[q] = x[|q - 200|]); x comes from the history h (x[160 b0 - 360 ..)) or the new samples.
__device__ __forceinline__ float reflected(const float* h, const float* x_new, long long b0, int j0, int i, int n_new) {
    const long long q = HOP * (b0 - 1 + j0) + i;
    const long long e = (q >= HALF ? q - HALF : HALF - q) - (HOP * b0 - HISTORY);
    float v = 0.0f;  // samples not yet known only reach frames that are not written
    if (e >= 0 && e < HISTORY) v = h[e];
    else if (e >= HISTORY && e < HISTORY + n_new) v = x_new[e - HISTORY];
    return v;
}

// Where frame g of a packed block goes: its slot and ring column (false: lane without a
// segment, or frame -1 of a new stream, which is not written).
__device__ __forceinline__ bool packed_dest(
    int g, int r, int nseg, int j0, int rem, float inv_rem, const long long* slots, const long long* b0s,
    const long long* cols, int ring_frames, long long& slot, int& col)
{
    const int s = (int)(((float)g + 0.5f) * inv_rem);
    if (s >= nseg) return false;
    const int row = r + s, j = j0 + g - s * rem;
    if (j == 0 && b0s[row] == 0) return false;
    col = (int)cols[row] + j;  // under twice the ring: cols < ring, j < n_frames <= ring
    if (col >= ring_frames) col -= ring_frames;
    slot = slots[row];
    return true;
}

// A block takes TILE frames: lane f of every warp works on frame f, and the warps split each
// stage's roles. Full blocks (captioner_logmel_fused, grid: rows x n_frames / TILE) take TILE
// consecutive frames of one row. When TILE does not divide n_frames, packed blocks
// (captioner_logmel_packed, a second launch) take the last rem = n_frames % TILE frames of
// TILE / rem rows each, one segment per row, so a push's remainders fill whole blocks instead
// of leaving most lanes of one block per row idle (a 10 s push ends in 8 frames; a 10 ms push
// is one). How many rows share a packed block is the host's choice (grids()). Two kernels
// rather than one with a branch keep the full blocks' code what it was: one kernel that
// decoded its block and carried both paths measured 4 % slower than before packing, the two
// 10 % faster.
// Frame t = b0 - 1 + j of a row covers the reflect-padded signal p[160 t .. 160 t + 399],
// p[q] = x[|q - 200|]. Frames with t < 0 (the first push of a stream completes none) and lanes
// without a frame compute on whatever shared memory holds; only real frames are written out.
// Full blocks: row r, frames j0 .. j0 + TILE - 1; packed: rows r .. r + nseg - 1, frames
// j0 .. j0 + rem - 1 each, segment s's samples at float seg * s.
template <bool PACKED> __device__ __forceinline__ void logmel_block(
    const float* __restrict__ samples, const long long* __restrict__ slots,
    const long long* __restrict__ b0s, const long long* __restrict__ cols,
    float* __restrict__ history, float* __restrict__ mel_ring, float* __restrict__ spk_ring,
    int n_frames, int ring_frames, int r, int j0, int nseg, int rem, int seg)
{
    extern __shared__ float4 shared_raw[];
    float* xs = reinterpret_cast<float*>(shared_raw);    // padded samples, then:
    float2* zs = reinterpret_cast<float2*>(shared_raw);  // FFT rows (FS float2 per frame)
#if TABLES_IN_SHARED  // the window and twiddles, copied from global memory (see _tables_in_shared)
    @TW1_TYPE@* c_tw1_flat = reinterpret_cast<@TW1_TYPE@*>(xs + WORK_FLOATS);
    float2* c_window2 = reinterpret_cast<float2*>(c_tw1_flat + 8 * 25);
    float2* c_tw2 = c_window2 + HALF;
    for (int i = threadIdx.x; i < 8 * 25; i += THREADS) c_tw1_flat[i] = (&g_tw1[0][0])[i];
    for (int i = threadIdx.x; i < HALF; i += THREADS) { c_window2[i] = g_window2[i]; c_tw2[i] = g_tw2[i]; }
#else
    const @TW1_TYPE@* c_tw1_flat = &g_tw1[0][0];
    const float2* c_window2 = g_window2;
    const float2* c_tw2 = g_tw2;
#endif
    const int tid = threadIdx.x, warp = tid >> 5, f = tid & 31;
    const int n_new = n_frames * HOP;
    const float* x_new = samples + (long long)r * n_new;

    // 1. The block's samples into shared memory, padded. Past a stream's start (no reflection)
    // a full block's samples are ext[160 j0 ..] of ext = history ++ new samples: see load_tile.
    // Only a row's first block (j0 == 0) reads the row's history (slot) and block count (b0).
    // A full first block also rolls the row's history on to the last 360 samples of ext: it is
    // the only block that reads that history, so it reads the new history now and writes it
    // once every thread of the block is past its reads (the barrier below); so does a packed
    // first block of one row. Packed first blocks of several rows (pushes under TILE frames)
    // roll theirs at the end, through shared memory.
    float keep0 = 0.0f, keep1 = 0.0f;
    const int k0 = tid, k1 = tid + THREADS;
    if constexpr (PACKED) {
        if (j0 == 0 && nseg == 1) {  // one row (a single stream's push): keep as a full block does
            const float* h = history + slots[r] * HISTORY;
            if (k0 < HISTORY) keep0 = n_new + k0 < HISTORY ? h[n_new + k0] : x_new[n_new + k0 - HISTORY];
            if (k1 < HISTORY) keep1 = n_new + k1 < HISTORY ? h[n_new + k1] : x_new[n_new + k1 - HISTORY];
        }
        load_packed(xs, samples, slots, history, r, nseg, j0, rem, seg, n_new);
        // Rows still in their reflection: only in a stream's first pushes of under TILE frames.
        // The barrier also orders their refill after load_packed's writes.
        const bool reflect = j0 == 0 && __syncthreads_or(tid < nseg && b0s[r + tid] < 3);
        if (reflect) {
            const int l = HOP * (rem - 1) + N_FFT;
            const float inv = 1.0f / (float)l;
            for (int i = tid; i < nseg * l; i += THREADS) {
                const int s = (int)(((float)i + 0.5f) * inv);
                const int row = r + s;
                const long long b0 = b0s[row];
                if (b0 >= 3) continue;
                const int e = i - s * l;
                xs[seg * s + padded(e)] = reflected(history + slots[row] * HISTORY,
                                                    samples + (long long)row * n_new, b0, 0, e, n_new);
            }
        }
    } else if (j0 > 0) {
        // j0 >= TILE, so the tile is past the reflection and the history: its loads need
        // neither b0 nor the slot, and go out without waiting for them.
        load_tile<false>(xs, history, x_new, j0);
    } else {
        const long long b0 = b0s[r];
        float* h = history + slots[r] * HISTORY;
        if (k0 < HISTORY) keep0 = n_new + k0 < HISTORY ? h[n_new + k0] : x_new[n_new + k0 - HISTORY];
        if (k1 < HISTORY) keep1 = n_new + k1 < HISTORY ? h[n_new + k1] : x_new[n_new + k1 - HISTORY];
        if (b0 - 1 >= 2) {
            load_tile<true>(xs, h, x_new, 0);
        } else {
#pragma unroll 4
            for (int i = tid; i < N_LOAD; i += THREADS) xs[padded(i)] = reflected(h, x_new, b0, 0, i, n_new);
        }
    }
    __syncthreads();
    if (j0 == 0 && nseg == 1) {
        float* h = history + slots[r] * HISTORY;
        if (k0 < HISTORY) h[k0] = keep0;
        if (k1 < HISTORY) h[k1] = keep1;
    }
    // Where lane f's samples start: frame f of a full block; frame f - s rem of segment s.
    int lane_floats = ROW * f;
    if constexpr (PACKED) {
        const int s = (int)(((float)f + 0.5f) * (1.0f / (float)rem));
        lane_floats = s < nseg ? seg * s + ROW * (f - s * rem) : 0;
    }

    // 2. Stage 1, role n1 = warp: z[n1 + 8 n2] = x[2 n1 + 16 n2] + i x[2 n1 + 16 n2 + 1]
    // (windowed: float32 products, as Whisper); DFT-25 over n2, times W200^(n1 k2), into slot
    // 25 n1 + k2 of the frame's row. Sample 2 n1 + 16 n2 sits n2 / 10 float2 of padding on
    // (2 n1 < 16 and 160 = 10 * 16), so every address is a base plus a constant.
    {
        const int n1 = warp;
        const float2* xf = reinterpret_cast<const float2*>(xs + lane_floats) + n1;
        const float2* wn = c_window2 + n1;
        float2 y[25];
#pragma unroll
        for (int n2 = 0; n2 < 25; ++n2) {
            const float2 v = xf[8 * n2 + n2 / 10];
            const float2 w = wn[8 * n2];
            y[n2] = make_float2(v.x * w.x, v.y * w.y);
        }
        const @TW1_TYPE@* tw = c_tw1_flat + 25 * n1;
        float2 out[25];
        // Every warp must have read its samples before the FFT rows overwrite them. float32
        // waits before the DFT (fewer live registers); float64 after it, so that one block's
        // float64 work overlaps another's waiting.
        if (!@LATE_BARRIER@) __syncthreads();
        @STAGE1@
        if (@LATE_BARRIER@) __syncthreads();
        float2* dst = zs + f * FS + 25 * n1;
#pragma unroll
        for (int k2 = 0; k2 < 25; ++k2) dst[k2] = out[k2];
    }
    __syncthreads();

    // 3. Stage 2 and untangling, by column pairs (see column_pair); powers left in the slots.
    // Warps 0..3 take pairs k2 = warp + 1 and warp + 9, warps 4..7 one pair, and warp 4 column
    // 0 as well. k2 stays a run-time value so that the code exists once (the instruction cache
    // is the limit when every role gets its own copy).
    {
        float2* zf = zs + f * FS;
#pragma unroll 1
        for (int k2 = warp + 1; k2 <= 12; k2 += WARPS) column_pair(zf, c_tw2, k2);
        if (warp == 4) column_zero(zf, c_tw2);
    }
    __syncthreads();

    // 4. Mel filters: a band group per warp, with the weights, and each bin's slot, written
    // into the code; slots are read as float2, whose two bins (k and 200 - k) the group mostly
    // both uses. log10 results go to the frame's free floats (lm_offset).
    {
        const float2* zf = zs + f * FS;
        float* row = reinterpret_cast<float*>(zs + f * FS);
        switch (warp) {
        @MEL_CASES@
        }
    }
    __syncthreads();

    // 5. Copy the log-mel frames into the ring (frame t at column t % ring). Thread tid moves
    // vector q = tid % VPF (bands VW q .. VW q + VW - 1, one aligned store) of frames
    // g = tid / VPF, + FPR a round: consecutive threads write consecutive 16 bytes.
    constexpr int VPF = N_MELS / VW, FPR = THREADS / VPF;
    const float inv_rem = PACKED ? 1.0f / (float)rem : 0.0f;
    {
        const int q = tid % VPF, gi = tid / VPF;
        const float* src = reinterpret_cast<const float*>(zs + gi * FS) + park(VW * q, LM_FIRST);
        if (!PACKED && gi < FPR) {
            // cols[r] is the column of frame b0 - 1; cols[r] + j0 + g stays under twice the
            // ring (cols[r] < ring, j0 + g < n_frames <= ring), so one subtraction wraps it.
            // Frame -1 (the first block of a new stream) is not written.
            const int g0 = (j0 == 0 && b0s[r] == 0) ? 1 : 0;
            int col0 = (int)cols[r] + j0;
            if (col0 >= ring_frames) col0 -= ring_frames;
            // one 64-bit address, then 32-bit byte offsets (a ring row is far under 4 GB)
            char* dst = reinterpret_cast<char*>(mel_ring + slots[r] * ring_frames * N_MELS + VW * q);
#pragma unroll
            for (int u = 0; u < (TILE + FPR - 1) / FPR; ++u) {
                const int g = gi + FPR * u;
                int c = col0 + g;
                if (c >= ring_frames) c -= ring_frames;
                if (g < TILE && g >= g0)
                    *reinterpret_cast<VEC*>(dst + (unsigned)c * (unsigned)(4 * N_MELS)) = load_vec(src + 2 * FS * FPR * u);
            }
        } else if (PACKED && gi < FPR) {
            for (int g = gi; g < TILE; g += FPR) {
                long long slot;
                int c;
                if (packed_dest(g, r, nseg, j0, rem, inv_rem, slots, b0s, cols, ring_frames, slot, c))
                    reinterpret_cast<VEC*>(mel_ring + (slot * ring_frames + c) * N_MELS)[q] = load_vec(src + 2 * FS * (g - gi));
            }
        }
    }

    // 6. Speaker bands: the speaker encoder's mel bands, worked out with the log-mel in stage 4
    // and parked after it (no barrier needed: stage 4 ended with one), copied into their ring
    // like the log-mel, one frame per warp at a time.
#if N_SPK > 0
    for (int g = warp; g < TILE; g += WARPS) {
        long long slot = slots[r];
        int c = (int)cols[r] + j0 + g;
        bool write = true;
        if (PACKED) {
            write = packed_dest(g, r, nseg, j0, rem, inv_rem, slots, b0s, cols, ring_frames, slot, c);
        } else {
            if (c >= ring_frames) c -= ring_frames;
            write = !(j0 + g == 0 && b0s[r] == 0);
        }
        const float* src = reinterpret_cast<const float*>(zs + g * FS);
        if (write)
            for (int k = f; k < N_SPK; k += 32) spk_ring[(slot * ring_frames + c) * N_SPK + k] = src[park(N_MELS + k, LM_FIRST)];
    }
#endif

    // 7. A packed first block of several rows rolls their histories on to the last 360 samples
    // of ext, staged in shared memory (free once every frame is copied out): all reads, then
    // all writes (too many to hold in registers from the start, as one row's are).
    if (PACKED && j0 == 0 && nseg > 1) {
        __syncthreads();
#pragma unroll 4
        for (int i = tid; i < nseg * HISTORY; i += THREADS) {
            const int s = i / HISTORY, k = i - s * HISTORY, row = r + s;
            xs[i] = n_new + k < HISTORY ? history[slots[row] * HISTORY + n_new + k]
                                        : samples[(long long)row * n_new + (n_new + k - HISTORY)];
        }
        __syncthreads();
#pragma unroll 4
        for (int i = tid; i < nseg * HISTORY; i += THREADS) {
            const int s = i / HISTORY, k = i - s * HISTORY;
            history[slots[r + s] * HISTORY + k] = xs[i];
        }
    }
}

#define LOGMEL_ARGS \
    const float* __restrict__ samples, const long long* __restrict__ slots, \
    const long long* __restrict__ b0s, const long long* __restrict__ cols, float* __restrict__ history, \
    float* __restrict__ mel_ring, float* __restrict__ spk_ring, int n_rows, int n_frames, int ring_frames

// Full blocks: grid (rows, n_frames / TILE).
extern "C" __global__ void __launch_bounds__(THREADS, @MIN_BLOCKS@) captioner_logmel_fused(LOGMEL_ARGS) {
    logmel_block<false>(samples, slots, b0s, cols, history, mel_ring, spk_ring, n_frames, ring_frames,
                        blockIdx.x, TILE * blockIdx.y, 1, 0, 0);
}

// Packed blocks: grid (rows / per, rounded up), per <= TILE / rem rows a block (see grids());
// only when TILE does not divide n_frames.
extern "C" __global__ void __launch_bounds__(THREADS, @MIN_BLOCKS@) captioner_logmel_packed(LOGMEL_ARGS, int per) {
    const int n_full = n_frames / TILE, rem = n_frames - TILE * n_full;
    const int r = blockIdx.x * per;
    logmel_block<true>(samples, slots, b0s, cols, history, mel_ring, spk_ring, n_frames, ring_frames,
                       r, TILE * n_full, min(per, n_rows - r), rem, g_segment_floats[rem]);
}
