// A fixture for common/tests/check_lessons.py: definitions in the styles the stages use.
template <int D, int BC>
__global__ void __launch_bounds__(128, launch_min_blocks<D, BC>())
    attention_kernel(const float *__restrict__ Q,  // [N, D]
                     int N) {
    if (N > 0) helper(Q[0]);
}

__device__ __forceinline__ float helper(float x) { return x; }

static cudaError_t attention_forward(const float *Q, int N) const noexcept {
    return helper_call(Q, N);  // a call: not a definition of helper_call
}
