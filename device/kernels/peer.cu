// Collectives over peer pointers (legacy IPC or cuMem-mapped workspaces): one-shot and
// two-shot all-reduce, all-gather, reduce-scatter, fused all-reduce + residual + RMSNorm, and
// a plain device read used by the conformance rig. Each is the device twin of the function
// of the same name in commsim/kernels/collectives.py: same workspace offsets, same flags,
// same chunking, and the same float32 summation order (rank 0 first), so float32 results
// are bit-identical to the simulator's. Layout and ordering notes: commsim_common.cuh.
#include "commsim_common.cuh"

// out[k] = sum over ranks j (in rank order) of in_j[k], k in [0, count), where in_j starts
// `in_off` bytes into rank j's DATA. 16-byte vectors where every operand shares the output's
// alignment, scalars for the ragged head and tail (two-shot chunks need not be aligned).
template <typename D>
__device__ void reduce_span(const Peers& p, int ws, u64 in_off, u64 out, u64 count) {
    const int S = D::SIZE;
    const int N = Pack<D>::N;
    u64 mis = out & 15;
    bool vec = (mis % S) == 0;
    for (int j = 0; j < ws && vec; ++j) vec = ((p.ptr[j] + DATA + in_off) & 15) == mis;
    u64 head = 0, nvec = 0;
    if (vec) {
        head = ((16 - mis) & 15) / S;
        if (head > count) head = count;
        nvec = (count - head) / N;
    }
    u64 tail = head + nvec * N;
    u64 t = global_thread(), T = grid_threads();
    for (u64 v = t; v < nvec; v += T) {
        u64 k = head + v * N;
        Pack<D> acc;
        acc.zero();
        for (int j = 0; j < ws; ++j) acc.add(ld_cg_v16(p.ptr[j] + DATA + in_off + k * S));
        *reinterpret_cast<V16*>(out + k * S) = acc.bits();
    }
    u64 nscalar = head + (count - tail);
    for (u64 s = t; s < nscalar; s += T) {
        u64 k = s < head ? s : tail + (s - head);
        float acc = 0.f;
        for (int j = 0; j < ws; ++j) acc += D::to_f(D::load(p.ptr[j] + DATA + in_off + k * S));
        D::store(out + k * S, D::from_f(acc));
    }
}

// dst[0, nbytes) = src[0, nbytes), by 16-byte vectors where both share an alignment.
__device__ void copy_span(u64 src, u64 dst, u64 nbytes) {
    u64 mis = dst & 15;
    u64 head = 0, nvec = 0;
    if ((src & 15) == mis) {
        head = (16 - mis) & 15;
        if (head > nbytes) head = nbytes;
        nvec = (nbytes - head) / 16;
    }
    u64 tail = head + nvec * 16;
    u64 t = global_thread(), T = grid_threads();
    for (u64 v = t; v < nvec; v += T)
        *reinterpret_cast<V16*>(dst + head + v * 16) = ld_cg_v16(src + head + v * 16);
    u64 nscalar = head + (nbytes - tail);
    for (u64 s = t; s < nscalar; s += T) {
        u64 b = s < head ? s : tail + (s - head);
        *reinterpret_cast<unsigned char*>(dst + b) = ld_cg_u8(src + b);
    }
}

__device__ __forceinline__ void start_barrier(const Peers& p, int ws, int me, u32 rnd) {
    // Every block signals (the same value, so the stores are idempotent): no block waits on
    // another block of its own grid being scheduled, whatever the grid size.
    signal_peers(p, ws, me, FLAG_START, rnd);
    wait_peers(p, ws, me, FLAG_START, rnd);
}

// The grid's last block, once every block is done reading peers, tells the peers so and
// waits until they are done reading this rank: only then may the host restage DATA.
__device__ __forceinline__ void end_barrier(const Peers& p, int ws, int me, u32 rnd) {
    if (last_block(p.ptr[me], ARRIVE_END)) {
        signal_peers(p, ws, me, FLAG_END, rnd);
        wait_peers(p, ws, me, FLAG_END, rnd);
    }
}

template <typename D>
__device__ void one_shot(const Peers& p, int ws, int me, u64 n, u64 cap, u32 rnd) {
    start_barrier(p, ws, me, rnd);
    reduce_span<D>(p, ws, 0, p.ptr[me] + DATA + cap, n);
    end_barrier(p, ws, me, rnd);
}

// Reduce-scatter into the own scratch (chunk `me`), then gather every peer's reduced chunk.
// The MID wait needs every block of the grid resident at once: the host caps the grid at
// the SM count (device/launch.py), one 512-thread block per SM always fits.
template <typename D>
__device__ void two_shot(const Peers& p, int ws, int me, u64 n, u64 cap, u32 rnd) {
    const int S = D::SIZE;
    u64 own = p.ptr[me];
    u64 lo, hi;
    chunk_range(n, ws, me, &lo, &hi);
    start_barrier(p, ws, me, rnd);
    reduce_span<D>(p, ws, lo * S, own + DATA + cap + lo * S, hi - lo);
    if (last_block(own, ARRIVE_MID)) signal_peers(p, ws, me, FLAG_MID, rnd);
    wait_peers(p, ws, me, FLAG_MID, rnd);  // includes this rank's own slot: all its blocks
    for (int j = 0; j < ws; ++j) {
        if (j == me) continue;
        u64 a, b;
        chunk_range(n, ws, j, &a, &b);
        copy_span(p.ptr[j] + DATA + cap + a * S, own + DATA + cap + a * S, (b - a) * S);
    }
    end_barrier(p, ws, me, rnd);
}

// Rank j's nbytes of input land at offset j * nbytes of every rank's scratch.
__device__ void all_gather_impl(const Peers& p, int ws, int me, u64 nbytes, u64 cap, u32 rnd) {
    u64 own = p.ptr[me];
    start_barrier(p, ws, me, rnd);
    for (int j = 0; j < ws; ++j) copy_span(p.ptr[j] + DATA, own + DATA + cap + j * nbytes, nbytes);
    end_barrier(p, ws, me, rnd);
}

// Rank me gets chunk me (n / ws elements) of the sum, at the start of its scratch.
template <typename D>
__device__ void reduce_scatter_impl(const Peers& p, int ws, int me, u64 n, u64 cap, u32 rnd) {
    u64 per = n / ws;
    start_barrier(p, ws, me, rnd);
    reduce_span<D>(p, ws, static_cast<u64>(me) * per * D::SIZE, p.ptr[me] + DATA + cap, per);
    end_barrier(p, ws, me, rnd);
}

// ---- fused all-reduce + residual + RMSNorm ---------------------------------------------------
// What Communicator.all_reduce_rmsnorm computes: s = float(dtype(sum_j x_j)) + residual;
// residual_out = dtype(s); out = dtype(s * rsqrt(mean(s^2) + eps) * weight), one row of
// `hidden` elements per block iteration. s is recomputed in the second pass (the same
// operations in the same order give the same bits) instead of being kept in shared memory,
// so any hidden size works; residual_out must therefore not alias residual_in.
__device__ float block_sum(float v) {
    __shared__ float part[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // part[] is reused row after row
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float t = 0.f;
    int nw = (blockDim.x + 31) >> 5;
    for (int i = 0; i < nw; ++i) t += part[i];
    return t;
}

template <typename D>
__device__ __forceinline__ float residual_sum(const Peers& p, int ws, u64 e, u64 residual_in) {
    float acc = 0.f;
    for (int j = 0; j < ws; ++j) acc += D::to_f(D::load(p.ptr[j] + DATA + e * D::SIZE));
    return D::to_f(D::from_f(acc)) + D::to_f(D::load(residual_in + e * D::SIZE));
}

template <typename D>
__device__ void fused_rmsnorm(const Peers& p, int ws, int me, u64 rows, u64 hidden, u64 cap,
                              u32 rnd, u64 residual_in, u64 residual_out, u64 weight, float eps) {
    const int S = D::SIZE;
    u64 out = p.ptr[me] + DATA + cap;
    start_barrier(p, ws, me, rnd);
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        float sq = 0.f;
        for (u64 k = threadIdx.x; k < hidden; k += blockDim.x) {
            u64 e = r * hidden + k;
            float s = residual_sum<D>(p, ws, e, residual_in);
            D::store(residual_out + e * S, D::from_f(s));
            sq += s * s;
        }
        float inv = rsqrtf(block_sum(sq) / static_cast<float>(hidden) + eps);
        for (u64 k = threadIdx.x; k < hidden; k += blockDim.x) {
            u64 e = r * hidden + k;
            float s = residual_sum<D>(p, ws, e, residual_in);
            float w = D::to_f(D::load(weight + k * S));
            D::store(out + e * S, D::from_f(s * inv * w));
        }
    }
    end_barrier(p, ws, me, rnd);
}

// ---- entry points (names: device/launch.py) --------------------------------------------------
#define COMMSIM_PEER_ENTRIES(name, D)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        one_shot_all_reduce_##name(Peers p, int ws, int me, u64 n, u64 cap, u32 rnd) {         \
        one_shot<D>(p, ws, me, n, cap, rnd);                                                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        two_shot_all_reduce_##name(Peers p, int ws, int me, u64 n, u64 cap, u32 rnd) {         \
        two_shot<D>(p, ws, me, n, cap, rnd);                                                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        reduce_scatter_##name(Peers p, int ws, int me, u64 n, u64 cap, u32 rnd) {              \
        reduce_scatter_impl<D>(p, ws, me, n, cap, rnd);                                        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) fused_all_reduce_rmsnorm_##name(     \
        Peers p, int ws, int me, u64 rows, u64 hidden, u64 cap, u32 rnd, u64 residual_in,      \
        u64 residual_out, u64 weight, float eps) {                                             \
        fused_rmsnorm<D>(p, ws, me, rows, hidden, cap, rnd, residual_in, residual_out, weight, \
                         eps);                                                                 \
    }

COMMSIM_PEER_ENTRIES(f32, F32)
COMMSIM_PEER_ENTRIES(f16, F16)
COMMSIM_PEER_ENTRIES(bf16, BF16)

extern "C" __global__ void __launch_bounds__(THREADS)
    all_gather(Peers p, int ws, int me, u64 nbytes, u64 cap, u32 rnd) {
    all_gather_impl(p, ws, me, nbytes, cap, rnd);
}

// A kernel's load of nbytes at src, copied to dst: how a device access (and its fault,
// cudaErrorIllegalAddress) is observed through a mapping.
extern "C" __global__ void __launch_bounds__(THREADS) read_bytes(u64 src, u64 dst, u64 nbytes) {
    copy_span(src, dst, nbytes);
}
