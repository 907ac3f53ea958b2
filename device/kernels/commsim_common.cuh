// Shared definitions of commsim's device kernels: workspace layout, the signal-flag protocol,
// dtype conversions. Compiled by NVRTC (device/build.py) without any CUDA toolkit header, so
// the CPU-only CI needs nothing but libnvrtc: fixed-width types, fp16/bf16 conversions and
// memory-ordered accesses are written here directly (inline PTX).
//
// Workspace of one rank (identical to commsim/kernels/workspace.py):
//   [0, 4096)                 flags: START, MID, END arrays of MAX_RANKS uint32 each
//   [DATA, DATA + capacity)   this rank's input, staged before the launch
//   [DATA + capacity, ...)    scratch: reduced chunks / results
// Flag protocol: a launch is one round; the flag value is the round number, so no flag is
// ever reset. Rank `me` stores `round` into slot `me` of a flag array in every peer's
// workspace, then spins until every slot of its own array is >= `round`.
//
// Device-only addition: bytes [ARRIVE, ARRIVE + 8) of the flag area (unused by the
// simulator) hold two block-arrival counters of this rank's grid (for MID and END). They are
// touched only in the rank's own workspace and reset by the last block to arrive, so the
// layout and the cross-rank protocol stay exactly the simulator's.
//
// Memory ordering (why these instructions):
// - flags are written with st.release.sys and read with ld.acquire.sys: the peers are other
//   GPUs (or other processes on this GPU), so the scope must be .sys; release makes the
//   writer's earlier data writes visible before the flag, acquire keeps the reader's later
//   data reads after it. A volatile loop alone orders nothing across GPUs.
// - a rank's grid reaches a barrier only when all its blocks are done with the phase: each
//   block bar.syncs, its thread 0 fences (fence.sc.gpu via __threadfence) and bumps the arrival
//   counter; the last block fences again (sys scope) before its release stores. This is the
//   fence-atomic-fence pattern of CUDA's threadFenceReduction sample, extended to .sys by the
//   release, which is cumulative over everything the block has observed.
// - peer data is read with ld.global.cg (L2, not L1): L1 is not coherent with stores made by
//   other GPUs, and a rank re-reads the same peer addresses every round.

#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define MAX_RANKS 128
#define FLAG_START 0
#define FLAG_MID (4 * MAX_RANKS)
#define FLAG_END (8 * MAX_RANKS)
#define ARRIVE (12 * MAX_RANKS)
#define ARRIVE_MID (ARRIVE + 0)
#define ARRIVE_END (ARRIVE + 4)
#define DATA 4096
#define THREADS 512

// Every rank's workspace base in this process's address space, passed by value (1 KiB of
// kernel parameters, under the 4 KiB limit of every supported architecture).
struct Peers {
    u64 ptr[MAX_RANKS];
};

struct alignas(16) V16 {
    u32 w[4];
};

// ---- flags ------------------------------------------------------------------------------
__device__ __forceinline__ void st_release_sys(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_acquire_sys(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ u32* flag_at(u64 base, int which, int slot) {
    return reinterpret_cast<u32*>(base + which + 4 * slot);
}

__device__ __forceinline__ void wait_flag(const u32* p, u32 rnd) {
    while (ld_acquire_sys(p) < rnd) {
    }
}

// Store `rnd` into slot `me` of array `which` at every peer (threads 0..ws-1, one peer each).
__device__ __forceinline__ void signal_peers(const Peers& p, int ws, int me, int which, u32 rnd) {
    int t = threadIdx.x;
    if (t < ws) {
        __threadfence_system();
        st_release_sys(flag_at(p.ptr[t], which, me), rnd);
    }
}

// Spin until every slot of this rank's own array `which` has reached `rnd`; then the block.
__device__ __forceinline__ void wait_peers(const Peers& p, int ws, int me, int which, u32 rnd) {
    int t = threadIdx.x;
    if (t < ws) wait_flag(flag_at(p.ptr[me], which, t), rnd);
    __syncthreads();
}

// True in exactly one block: the last of the grid to finish the phase. It resets the counter
// (safe: every other block has already counted in, and the next launch is stream-ordered).
__device__ __forceinline__ bool last_block(u64 own, int counter) {
    __shared__ int is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* c = reinterpret_cast<u32*>(own + counter);
        __threadfence();
        u32 prev = atomicAdd(c, 1u);
        is_last = (prev == gridDim.x - 1);
        if (is_last) {
            atomicExch(c, 0u);
            __threadfence();
        }
    }
    __syncthreads();
    return is_last != 0;
}

// ---- loads and stores of data -------------------------------------------------------------
__device__ __forceinline__ V16 ld_cg_v16(u64 addr) {
    V16 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                 : "l"(addr));
    return v;
}

__device__ __forceinline__ u32 ld_cg_u32(u64 addr) {
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(addr));
    return v;
}

__device__ __forceinline__ u16 ld_cg_u16(u64 addr) {
    u16 v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(addr));
    return v;
}

__device__ __forceinline__ unsigned char ld_cg_u8(u64 addr) {
    u16 v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(addr));
    return static_cast<unsigned char>(v);
}

// ---- dtypes: float32 accumulation for every type ---------------------------------------------
// Conversions round to nearest even, as torch's .to(float16 / bfloat16) does, so a reduction
// in the same order as the simulator's gives the same bits.
struct F32 {
    typedef u32 Bits;
    static constexpr int SIZE = 4;
    __device__ static float to_f(Bits b) { return __uint_as_float(b); }
    __device__ static Bits from_f(float f) { return __float_as_uint(f); }
    __device__ static Bits load(u64 a) { return ld_cg_u32(a); }
    __device__ static void store(u64 a, Bits b) { *reinterpret_cast<u32*>(a) = b; }
};

struct F16 {
    typedef u16 Bits;
    static constexpr int SIZE = 2;
    __device__ static float to_f(Bits b) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
        return f;
    }
    __device__ static Bits from_f(float f) {
        u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
    __device__ static Bits load(u64 a) { return ld_cg_u16(a); }
    __device__ static void store(u64 a, Bits b) { *reinterpret_cast<u16*>(a) = b; }
};

struct BF16 {
    typedef u16 Bits;
    static constexpr int SIZE = 2;
    __device__ static float to_f(Bits b) { return __uint_as_float(static_cast<u32>(b) << 16); }
    __device__ static Bits from_f(float f) {
        u16 h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));  // sm_80+
        return h;
    }
    __device__ static Bits load(u64 a) { return ld_cg_u16(a); }
    __device__ static void store(u64 a, Bits b) { *reinterpret_cast<u16*>(a) = b; }
};

// Elements of type D packed in 16 bytes, as floats.
template <typename D>
struct Pack {
    static constexpr int N = 16 / D::SIZE;
    float f[N];

    __device__ void zero() {
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] = 0.f;
    }
    __device__ void add(const V16& v) {
        const typename D::Bits* e = reinterpret_cast<const typename D::Bits*>(&v);
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] += D::to_f(e[i]);
    }
    __device__ V16 bits() const {
        V16 v;
        typename D::Bits* e = reinterpret_cast<typename D::Bits*>(&v);
#pragma unroll
        for (int i = 0; i < N; ++i) e[i] = D::from_f(f[i]);
        return v;
    }
};

__device__ __forceinline__ u64 global_thread() {
    return static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 grid_threads() {
    return static_cast<u64>(gridDim.x) * blockDim.x;
}

// Element range [lo, hi) of chunk i when n elements are split over ws ranks: the first
// n % ws chunks get one extra element (commsim.kernels.workspace.chunks).
__device__ __forceinline__ void chunk_range(u64 n, int ws, int i, u64* lo, u64* hi) {
    u64 base = n / ws, extra = n % ws;
    u64 ii = static_cast<u64>(i);
    *lo = ii * base + (ii < extra ? ii : extra);
    *hi = *lo + base + (ii < extra ? 1 : 0);
}
