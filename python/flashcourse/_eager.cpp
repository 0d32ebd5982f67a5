/*
 * python/flashcourse/_eager.cpp: the eager hot path of flashcourse.attention in C++, the
 * operator flashcourse_eager::attention (build/lib/libflashcourse_eager.so, `make lib` where
 * python3 has torch; python/lib.mk).
 *
 * flashcourse.attention checks a call's arguments once, in Python, and keeps the plans the stage
 * libraries made for it (python/flashcourse/_plans.py). What runs on every later call is one
 * forward pass and, through autograd, one backward pass of those plans. Done in Python, that is
 * a torch.autograd.Function, whose backward the autograd engine reaches through the interpreter,
 * and at small shapes that host time, not the kernels, decides a training step's pace (the
 * README's per-call table has both paths). Here the same two passes are a torch::autograd::Function
 * in C++: the outputs allocated through PyTorch's caching allocator, the library's attn_lib_forward
 * / attn_lib_backward called through the function pointers the binding loaded (ctypes), on the
 * current stream, nothing waiting for the GPU. The binding describes a call once, as a struct
 * eager_call with its plans in a CPU byte tensor (_run._EagerCall, the same fields), and passes
 * that with each call.
 *
 * Nothing is checked here that the binding checked for this call, except what can differ
 * between tensors of one shape: the upstream gradient's layout. dO reaches the backward pass in
 * its own layout where the backward stage takes strides (a second plan for that layout, made
 * here once per layout by attn_lib_plan, as _plans._Plan.with_do does; four at most), else copied
 * into o's layout.
 * flashcourse.flash_attn_func's calls take its tensors as they are, [B, N, H, D] (eager_call's
 * bnhd): the plans are made for their [B, H, N, D] views (the same memory), the outputs laid out
 * as those plans say, lse [B, H, N]; no transposes, no view nodes in the autograd graph.
 * A packed batch (flashcourse.flash_attn_varlen_func) runs the same passes through the operator
 * flashcourse_eager::attention_varlen, which takes the sequences' boundaries (cu_seqlens_q,
 * cu_seqlens_k: int32 on the device, never read here) beside q, k, v: q [total_q, H, D], lse
 * [H, total_q].
 * The binding falls back to its Python path (torch.autograd.Function over ctypes) where this
 * library is missing, was built for another torch, or FLASHCOURSE_EAGER_OP=0.
 */
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "attn_lib.h"  // common/: build_eager.py puts it on the include path

namespace {

// common/attn_lib.h's entry points, reached through the pointers the binding loaded
typedef decltype(&attn_lib_forward) forward_fn;
typedef decltype(&attn_lib_backward) backward_fn;
typedef decltype(&attn_lib_plan) plan_fn;
typedef decltype(&attn_lib_last_error) last_error_fn;

constexpr int64_t EAGER_ABI = 6;   // _run._EAGER_ABI (6: bnhd, flash_attn_func's layout)
constexpr int DO_ROWS = 12;        // dO's {batch, head, row} strides among the request's 24
constexpr int DO_LAYOUTS_MAX = 4;  // _run._DO_LAYOUTS_MAX: more are copied into o's layout

// One call as the binding describes it (_run._EagerCall: the same fields, in this order), at
// the start of a CPU byte tensor that holds its plans after it (offsets from the struct). The
// tensor is the operator's argument, and the autograd node keeps it: a call's plans live as long
// as a graph that may run its backward pass, whatever the binding's cache drops meanwhile.
struct eager_call {
    int64_t abi;  // EAGER_ABI
    // the forward pass: the forward stage's attn_lib_forward, its plan, the workspace it needs
    forward_fn forward;
    uint64_t forward_plan;  // offset
    uint64_t forward_workspace;
    last_error_fn forward_error;
    // the backward pass (backward NULL: the call wants no gradient)
    backward_fn backward;
    uint64_t backward_plan;  // offset
    uint64_t backward_workspace;
    last_error_fn backward_error;
    // the backward plan's request (attn_lib_plan), for a dO laid out otherwise than the plan's
    plan_fn plan;
    uint64_t plan_bytes;
    attn_lib_request request;
    int32_t backward_takes_strides;  // else dO is copied into o's layout
    // the library's return codes (attn_lib_exit_codes)
    int32_t code_pass, code_usage, code_unsupported, code_oom;
    // 1: q, k, v (o, dO, dQ, dK, dV) are [B, N, H, D], the plans' [B, H, N, D] views transposed
    // (flash_attn_func's layout; lse [B, H, N]); 0: [B, H, N, D], or packed [total, H, D]
    int32_t bnhd;
    const char *backward_stage;  // its name
    // backward plans for other layouts of dO, made here: room for DO_LAYOUTS_MAX of plan_bytes
    // each at offset do_plans, do_layouts of them made, {batch, head, row} each
    uint64_t do_plans;
    int32_t do_layouts;
    int64_t do_rows[DO_LAYOUTS_MAX][3];
    uint64_t do_workspace[DO_LAYOUTS_MAX];
};

eager_call *call_at(const at::Tensor &call) {
    TORCH_CHECK(call.device().is_cpu() && call.scalar_type() == at::kByte && call.is_contiguous() &&
                    call.numel() >= (int64_t)sizeof(eager_call),
                "flashcourse_eager: the call is the binding's byte tensor (_run._eager_call)");
    eager_call *c = reinterpret_cast<eager_call *>(call.data_ptr());
    TORCH_CHECK(c->abi == EAGER_ABI,
                "flashcourse_eager: not a call of this library's version (rebuild: make lib)");
    return c;
}

const void *at_offset(const eager_call *c, uint64_t offset) {
    return reinterpret_cast<const char *>(c) + offset;
}

// A nonzero return code as the binding raises it (_library._raise): ValueError for a usage or
// unsupported code (but "no NVIDIA GPU here"), torch.OutOfMemoryError, else RuntimeError.
[[noreturn]] void fail(const eager_call *c, int rc, last_error_fn last_error, const char *call) {
    const char *why = last_error ? last_error() : nullptr;
    std::string msg = why && *why ? why : std::string(call) + " returned " + std::to_string(rc);
    if (rc == c->code_oom) C10_THROW_ERROR(OutOfMemoryError, msg);
    if ((rc == c->code_usage || rc == c->code_unsupported) &&
        msg.find("no NVIDIA GPU here") == std::string::npos)
        C10_THROW_ERROR(ValueError, msg);
    C10_THROW_ERROR(Error, msg);
}

void *current_stream(const at::Tensor &t) {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
        ->getStream(t.device())
        .native_handle();
}

at::Tensor workspace(uint64_t bytes, const at::Tensor &like) {
    return bytes ? at::empty({(int64_t)bytes}, like.options().dtype(at::kByte)) : at::Tensor();
}

// A packed batch's sequence boundaries (cu_seqlens_q or _k) as the library takes them; nullptr:
// not packed (the tensor undefined).
const int *seqlens(const at::Tensor &cu) {
    return cu.defined() ? cu.data_ptr<int>() : nullptr;
}

// A tensor's {batch, head, row} strides: [B, H, N, D], [B, N, H, D] (bnhd), or packed
// [total, H, D] (batch unused: 0).
void rows_of(const at::Tensor &t, bool bnhd, int64_t rows[3]) {
    const bool packed = t.dim() == 3;
    rows[0] = packed ? 0 : t.stride(0);
    rows[1] = t.stride(packed || !bnhd ? 1 : 2);
    rows[2] = t.stride(packed ? 0 : bnhd ? 1 : 2);
}

// An output like t (o like q, dQ like q, dK like k, dV like v) laid out as the binding planned
// it (_plans._like_rows): torch.empty_like of t, or with bnhd of t's [B, H, N, D] view,
// transposed back (t's own strides where t is dense; where it is not, such as a fused
// projection's slice, what empty_like makes of the view).
at::Tensor like(const at::Tensor &t, bool bnhd) {
    if (!bnhd || t.is_non_overlapping_and_dense()) return at::empty_like(t);
    return at::empty_like(t.transpose(1, 2)).transpose(1, 2);
}

// cu_q, cu_k: a packed batch's boundaries (q [total_q, H, D], lse [H, total_q]), else undefined
std::vector<at::Tensor> run_forward(const eager_call *c, const at::Tensor &q, const at::Tensor &k,
                                    const at::Tensor &v, const at::Tensor &cu_q,
                                    const at::Tensor &cu_k) {
    at::Tensor o = like(q, c->bnhd);
    const auto f32 = q.options().dtype(at::kFloat);
    at::Tensor lse = cu_q.defined() ? at::empty({q.size(1), q.size(0)}, f32)
                     : c->bnhd      ? at::empty({q.size(0), q.size(2), q.size(1)}, f32)
                                    : at::empty({q.size(0), q.size(1), q.size(2)}, f32);
    at::Tensor ws = workspace(c->forward_workspace, q);
    int rc =
        c->forward(at_offset(c, c->forward_plan), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                   o.data_ptr(), lse.data_ptr<float>(), seqlens(cu_q), seqlens(cu_k),
                   ws.defined() ? ws.data_ptr() : nullptr, c->forward_workspace, current_stream(q));
    if (rc != c->code_pass) fail(c, rc, c->forward_error, "attn_lib_forward");
    return {o, lse};
}

std::mutex do_plans_lock;  // the do_* fields of every call

// The backward plan for dO laid out with these {batch, head, row} strides: the binding's plan
// where they are the ones it was made for (o's), else one made here once per layout; NULL when
// DO_LAYOUTS_MAX are made already (the caller copies dO into o's layout).
const void *plan_for_rows(eager_call *c, const int64_t rows[3], uint64_t *ws) {
    auto same = [rows](const auto *r) {  // r: the request's long long strides or do_rows' int64_t
        return r[0] == rows[0] && r[1] == rows[1] && r[2] == rows[2];
    };
    if (same(c->request.strides + DO_ROWS)) {
        *ws = c->backward_workspace;
        return at_offset(c, c->backward_plan);
    }
    std::lock_guard<std::mutex> hold(do_plans_lock);
    for (int i = 0; i < c->do_layouts; i++)
        if (same(c->do_rows[i])) {
            *ws = c->do_workspace[i];
            return at_offset(c, c->do_plans + i * c->plan_bytes);
        }
    if (c->do_layouts == DO_LAYOUTS_MAX) return nullptr;
    attn_lib_request r = c->request;
    for (int i = 0; i < 3; i++) r.strides[DO_ROWS + i] = rows[i];
    char *plan = reinterpret_cast<char *>(c) + c->do_plans + c->do_layouts * c->plan_bytes;
    size_t bytes = 0;
    int rc = c->plan(&r, plan, c->plan_bytes, &bytes);
    if (rc != c->code_pass) fail(c, rc, c->backward_error, "attn_lib_plan");
    for (int i = 0; i < 3; i++) c->do_rows[c->do_layouts][i] = rows[i];
    c->do_workspace[c->do_layouts] = *ws = bytes;
    c->do_layouts++;
    return plan;
}

std::vector<at::Tensor> run_backward(eager_call *c, const at::Tensor &q, const at::Tensor &k,
                                     const at::Tensor &v, const at::Tensor &o,
                                     const at::Tensor &lse, at::Tensor d_o, const at::Tensor &cu_q,
                                     const at::Tensor &cu_k) {
    // dO as the backward pass takes it (_plans.grad_input): a contiguous last dimension and
    // 16-byte aligned, then in its own layout if the stage takes strides, else in o's
    if (d_o.stride(-1) != 1 || reinterpret_cast<uintptr_t>(d_o.data_ptr()) % 16)
        d_o = d_o.clone(at::MemoryFormat::Contiguous);
    if (!c->backward_takes_strides && d_o.strides() != o.strides())
        d_o = at::empty_like(o).copy_(d_o);
    int64_t rows[3];
    rows_of(d_o, c->bnhd, rows);
    uint64_t ws_bytes = 0;
    const void *plan = plan_for_rows(c, rows, &ws_bytes);
    if (!plan) {  // a fifth layout of dO: into o's, the binding's plan's
        d_o = at::empty_like(o).copy_(d_o);
        ws_bytes = c->backward_workspace;
        plan = at_offset(c, c->backward_plan);
    }

    at::Tensor dq = like(q, c->bnhd), dk = like(k, c->bnhd), dv = like(v, c->bnhd);
    at::Tensor ws = workspace(ws_bytes, q);
    int rc = c->backward(plan, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                         lse.data_ptr<float>(), d_o.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                         dv.data_ptr(), seqlens(cu_q), seqlens(cu_k),
                         ws.defined() ? ws.data_ptr() : nullptr, ws_bytes, current_stream(q));
    if (rc != c->code_pass) fail(c, rc, c->backward_error, "attn_lib_backward");
    return {dq, dk, dv};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// dq, dk, dv as they are, tied to q, k, v by a derivative that raises: a backward pass with
// create_graph=True gets gradients whose own gradient (double backward) says it is unsupported.
struct NoDerivative : public torch::autograd::Function<NoDerivative> {
    static variable_list forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k,
                                 const at::Tensor &v, const at::Tensor &dq, const at::Tensor &dk,
                                 const at::Tensor &dv, const at::Tensor &call) {
        ctx->saved_data["call"] = call;
        return {dq, dk, dv};
    }
    static variable_list backward(AutogradContext *ctx, variable_list) {
        eager_call *c = call_at(ctx->saved_data["call"].toTensor());
        C10_THROW_ERROR(Error, std::string("flashcourse.attention: double backward (a gradient "
                                           "of the gradients) is not supported: the backward "
                                           "pass (") +
                                   c->backward_stage + ") has no derivative");
    }
};

// A packed batch's boundaries, or none (torch::autograd::Function::apply refuses an undefined
// tensor argument: "tensor does not have a device").
typedef std::optional<at::Tensor> maybe_tensor;

// A boundary kept for the backward pass (saved_data), undefined where there is none.
at::Tensor saved_tensor(AutogradContext *ctx, const char *name) {
    const c10::IValue &saved = ctx->saved_data[name];
    return saved.isNone() ? at::Tensor() : saved.toTensor();
}

// o, lse = attention(q, k, v); lse is a constant (no gradient flows through it), and a missing
// gradient of o stays missing (no zeros made). cu_q, cu_k: a packed batch's boundaries (kept for
// the backward pass), else none.
struct Attention : public torch::autograd::Function<Attention> {
    static variable_list forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k,
                                 const at::Tensor &v, const at::Tensor &call,
                                 const maybe_tensor &cu_q, const maybe_tensor &cu_k) {
        eager_call *c = call_at(call);
        variable_list out =
            run_forward(c, q, k, v, cu_q.value_or(at::Tensor()), cu_k.value_or(at::Tensor()));
        ctx->save_for_backward({q, k, v, out[0], out[1]});
        ctx->saved_data["cu_q"] = cu_q;
        ctx->saved_data["cu_k"] = cu_k;
        ctx->saved_data["call"] = call;
        ctx->mark_non_differentiable({out[1]});
        ctx->set_materialize_grads(false);
        return out;
    }
    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        const at::Tensor none;  // no gradient: the call's, the boundaries'
        if (!grads[0].defined()) return {none, none, none, none, none, none};
        const at::Tensor call = ctx->saved_data["call"].toTensor();
        eager_call *c = call_at(call);
        TORCH_CHECK(c->backward,
                    "flashcourse_eager: this call was planned without a backward "
                    "pass");
        variable_list s = ctx->get_saved_variables();
        variable_list d = run_backward(c, s[0], s[1], s[2], s[3], s[4], grads[0],
                                       saved_tensor(ctx, "cu_q"), saved_tensor(ctx, "cu_k"));
        if (at::GradMode::is_enabled())  // create_graph=True: a derivative of these would be wrong
            d = NoDerivative::apply(s[0], s[1], s[2], d[0], d[1], d[2], call);
        return {d[0], d[1], d[2], none, none, none};
    }
};

// The forward pass alone where no gradient is wanted (no autograd node), else through Attention.
std::tuple<at::Tensor, at::Tensor> attend(const at::Tensor &q, const at::Tensor &k,
                                          const at::Tensor &v, const at::Tensor &call,
                                          const maybe_tensor &cu_q, const maybe_tensor &cu_k) {
    eager_call *c = call_at(call);
    variable_list out = c->backward ? Attention::apply(q, k, v, call, cu_q, cu_k)
                                    : run_forward(c, q, k, v, cu_q.value_or(at::Tensor()),
                                                  cu_k.value_or(at::Tensor()));
    return {out[0], out[1]};
}

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor &q, const at::Tensor &k,
                                             const at::Tensor &v, const at::Tensor &call) {
    return attend(q, k, v, call, std::nullopt, std::nullopt);
}

// A packed batch: q [total_q, H, D], k, v [total_k, H_kv, D], cu_seqlens_q, cu_seqlens_k [B + 1]
// int32 on q's device; o like q, lse [H, total_q].
std::tuple<at::Tensor, at::Tensor> attention_varlen(const at::Tensor &q, const at::Tensor &k,
                                                    const at::Tensor &v, const at::Tensor &cu_q,
                                                    const at::Tensor &cu_k,
                                                    const at::Tensor &call) {
    return attend(q, k, v, call, cu_q, cu_k);
}

}  // namespace

TORCH_LIBRARY(flashcourse_eager, m) {
    m.def("attention(Tensor q, Tensor k, Tensor v, Tensor call) -> (Tensor, Tensor)");
    m.def(
        "attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "Tensor call) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flashcourse_eager, CompositeImplicitAutograd, m) {
    m.impl("attention", attention);
    m.impl("attention_varlen", attention_varlen);
}
