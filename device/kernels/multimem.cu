// NVLS all-reduce over a multicast object (sm_90+): the device twin of
// commsim.kernels.collectives.multimem_all_reduce. Rank `me` multimem.ld_reduce's its
// chunk of DATA over the multicast address (the NVSwitch sums every member's copy) and
// multimem.st's the sum into every member's scratch. Flags travel by multicast stores too:
// one multimem.st.release writes slot `me` of every member's flag array at once; each rank
// then acquire-spins on its own unicast copy.
//
// Unlike the peer kernels, the work is split in 16-byte units, not elements: multimem
// floating-point operations move 32, 64 or 128 bits, never one 16-bit element. The last unit
// may reach up to 15 bytes past n inside DATA and the scratch (the host checks the capacity
// is a multiple of 16); those bytes are never read back. Which rank reduces which bytes does
// not change the result, and the switch's summation order is its own, so results match the
// simulator within float32-accumulation tolerance, not bit for bit.
//
// fence.proxy.alias: the flags and data are written through the multicast address and read
// through the unicast one (two virtual aliases of the same memory); the PTX memory model
// orders such accesses only across an alias proxy fence.
#include "commsim_common.cuh"

__device__ __forceinline__ void mm_st_release_u32(u64 addr, u32 v) {
    asm volatile("multimem.st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void fence_alias() {
    asm volatile("fence.proxy.alias;" ::: "memory");
}

template <typename D>
struct MM;

template <>
struct MM<F32> {
    __device__ static void reduce_store(u64 src, u64 dst) {
        float a, b, c, d;
        asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(a), "=f"(b), "=f"(c), "=f"(d)
                     : "l"(src)
                     : "memory");
        asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst),
                     "f"(a), "f"(b), "f"(c), "f"(d)
                     : "memory");
    }
};

template <>
struct MM<F16> {
    __device__ static void reduce_store(u64 src, u64 dst) {
        u32 a, b, c, d;
        asm volatile(
            "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2 {%0, %1, %2, %3}, [%4];"
            : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
            : "l"(src)
            : "memory");
        asm volatile("multimem.st.relaxed.sys.global.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst),
                     "r"(a), "r"(b), "r"(c), "r"(d)
                     : "memory");
    }
};

template <>
struct MM<BF16> {
    __device__ static void reduce_store(u64 src, u64 dst) {
        u32 a, b, c, d;
        asm volatile(
            "multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2 {%0, %1, %2, %3}, [%4];"
            : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
            : "l"(src)
            : "memory");
        asm volatile("multimem.st.relaxed.sys.global.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst),
                     "r"(a), "r"(b), "r"(c), "r"(d)
                     : "memory");
    }
};

__device__ __forceinline__ void mm_signal(u64 mc, int which, int me, u32 rnd) {
    if (threadIdx.x == 0) {
        __threadfence_system();
        fence_alias();
        mm_st_release_u32(mc + which + 4 * me, rnd);
    }
}

__device__ __forceinline__ void mm_wait(u64 uc, int ws, int which, u32 rnd) {
    int t = threadIdx.x;
    if (t < ws) {
        wait_flag(flag_at(uc, which, t), rnd);
        fence_alias();
    }
    __syncthreads();
}

template <typename D>
__device__ void multimem_all_reduce(u64 mc, u64 uc, int me, int ws, u64 n, u64 cap, u32 rnd) {
    mm_signal(mc, FLAG_START, me, rnd);  // every block: idempotent, no intra-grid dependency
    mm_wait(uc, ws, FLAG_START, rnd);
    u64 units = (n * D::SIZE + 15) / 16;
    u64 lo, hi;
    chunk_range(units, ws, me, &lo, &hi);
    u64 t = global_thread(), T = grid_threads();
    for (u64 u = lo + t; u < hi; u += T) MM<D>::reduce_store(mc + DATA + u * 16, mc + DATA + cap + u * 16);
    if (last_block(uc, ARRIVE_END)) {
        mm_signal(mc, FLAG_END, me, rnd);
        mm_wait(uc, ws, FLAG_END, rnd);
    }
}

#define COMMSIM_MULTIMEM_ENTRY(name, D)                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) multimem_all_reduce_##name(        \
        u64 mc, u64 uc, int me, int ws, u64 n, u64 cap, u32 rnd) {                           \
        multimem_all_reduce<D>(mc, uc, me, ws, n, cap, rnd);                                 \
    }

COMMSIM_MULTIMEM_ENTRY(f32, F32)
COMMSIM_MULTIMEM_ENTRY(f16, F16)
COMMSIM_MULTIMEM_ENTRY(bf16, BF16)
