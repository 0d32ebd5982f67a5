/*
 * common/device/tensor_map.cuh: the driver's tensor-map encoder (cuTensorMapEncodeTiled), fetched
 * once through the runtime, so that no stage links -lcuda; host code. Stage 6 describes its Q, K,
 * V and O tiles with it; stage 7 its dQ reductions. NULL where the driver has none (older than
 * CUDA 12).
 */
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (!fn) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &found) == cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
#else
        if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
#endif
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}
