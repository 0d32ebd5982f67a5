/*
 * stage6_hopper/mainloop.cuh: the consumers: each consumer warpgroup's loop over the key tiles of
 * its block's work tiles. Its pieces (the two GEMMs issued from descriptors, the turns of
 * ping-pong on named barriers, the releases of K, V and Q), then the schedules: consumer_serial
 * (variant nooverlap) and consumer_overlapped (the default: softmax under the P V before, and
 * the warpgroups taking turns at the tensor cores).
 */
#pragma once

#include "epilogue.cuh"
#include "schedule.cuh"
#include "smem.cuh"
#include "softmax.cuh"

/* ---- the consumers' pieces ------------------------------------------------------------------- */

// wgmma's A operand from registers (P of O += P V) has the accumulator's layout, two halves a
// register: a 64 x 16 k-step is 4 registers a thread.
constexpr int A_REGS_PER_KSTEP = WGMMA_M * WGMMA_K / 2 / WARPGROUP;

// The operands of S = Q K_j^T as wgmma descriptors: this warpgroup's 64 rows of work tile wt's
// Q, and K_j (ring slot K_tile). Worked out before a warpgroup waits for its turn, so that the
// turn goes to issuing (LOG.md, step 18).
typedef struct {
    uint64_t Q, K;
} scores_operands;
template <int D, int C, int BC>
__device__ __forceinline__ scores_operands scores_operands_of(const smem_tiles &sm,
                                                              const consumer_place &p,
                                                              const work_tile &wt,
                                                              uint32_t K_tile) {
    return {desc_k_major(q_stage<D, C, BC>(sm, wt.t) + p.wg * WGMMA_M * SLAB_ROW_BYTES),
            desc_k_major(K_tile)};
}

// The operand of O += P V_j from shared memory: V_j (ring slot st) as a wgmma descriptor.
template <int D, int BC>
__device__ __forceinline__ uint64_t pv_operand_of(const smem_tiles &sm, int st) {
    return desc_mn_major<BC>(v_stage<D, BC>(sm, st));
}

// Start S = Q K_j^T: D / 16 wgmma from shared memory, one group.
template <int D, int C, int BC, bool BF16>
__device__ __forceinline__ void issue_scores(float (&S)[BC / 2], scores_operands op) {
    // LAB HOLE 3 BEGIN: S = Q K_j^T by wgmma from shared memory
    // LAB TODO: wgmma_fence (the registers of S are written by the tensor cores from here on), then
    // LAB TODO: one wgmma per k16 step kk < D / WGMMA_K, both operands from shared memory (_ss),
    // LAB TODO: K-major: A = this warpgroup's 64 rows of Q,
    // LAB TODO: desc_k_major_step<block_rows<C>()>(op.Q, kk), B = K_j's BC rows,
    // LAB TODO: desc_k_major_step<BC>(op.K, kk). The shape is m64 x n(BC) x k16: wgmma_ss<BC,
    // LAB TODO: BF16> (sm90.cuh's wrappers by N; BF16 the storage type: .f16 or .bf16 operands).
    // LAB TODO: Accumulate (last
    // LAB TODO: argument) from the second step on: the first overwrites S. Then wgmma_commit: one
    // LAB TODO: group, waited for later.
    // LAB STUB: for (int i = 0; i < BC / 2; ++i) S[i] = 0.f;  // until filled: every score 0
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / WGMMA_K; ++kk)
        wgmma_ss<BC, BF16>(S, desc_k_major_step<block_rows<C>()>(op.Q, kk),
                           desc_k_major_step<BC>(op.K, kk), kk > 0);
    wgmma_commit();
    // LAB HOLE 3 END
}

// Start O += P V_j: BC / 16 wgmma, P from registers (four per k-step), V_j from shared memory
// (V_desc: pv_operand_of its ring slot).
// For the first key tile of a work tile (accumulate = 0) the first k-step overwrites O_acc: O
// starts from zero, whatever the last work tile left in the registers.
template <int D, int BC, bool BF16>
__device__ __forceinline__ void issue_pv(float (&O_acc)[D / 2], const uint32_t (&P)[BC / 4],
                                         uint64_t V_desc, int accumulate) {
    pin_registers(O_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BC / WGMMA_K; ++kk)
        wgmma_rs<D, BF16>(O_acc, &P[A_REGS_PER_KSTEP * kk], desc_mn_major_step(V_desc, kk),
                          kk > 0 || accumulate);
    wgmma_commit();
}

// Release a K, V or Q buffer: one arrival per warp, once the warp's wgmma reading it are done.
__device__ __forceinline__ void release(uint32_t bar, const consumer_place &p) {
    __syncwarp();
    if (p.lane == 0) mbar_arrive(bar);
}

// Named barriers (bar.sync / bar.arrive; barrier 0 is __syncthreads'): NAMED_BARRIER_TURN_WG0 + wg
// says "consumer warpgroup wg may issue its GEMMs" (ping-pong), for each of the C <= 3 consumers.
enum named_barrier {
    NAMED_BARRIER_SYNCTHREADS = 0,
    NAMED_BARRIER_TURN_WG0,
    NAMED_BARRIER_TURN_WG1,
    NAMED_BARRIER_TURN_WG2,
};
constexpr int TURN_THREADS = 2 * WARPGROUP;  // the warpgroup that waits, the one that hands over

// Ping-pong: the consumer warpgroups take turns at issuing their GEMMs, in a ring 0, 1, (2,)
// 0, ... A warpgroup waits for its turn (bar.sync on its turn barrier, its 128 threads), issues
// S_j and P_{j-1} V_{j-1}, then hands the turn on (bar.arrive on the next one's barrier: the
// other 128 of the 256). So one warpgroup's wgmma run while the others do their softmax, and
// the tensor pipe never waits for all softmaxes at once.
__device__ __forceinline__ void pingpong_wait_turn(int wg) {
    named_barrier_sync<TURN_THREADS>(NAMED_BARRIER_TURN_WG0 + wg);
}
template <int CONSUMERS>
__device__ __forceinline__ void pingpong_pass_turn(int wg) {
    named_barrier_arrive<TURN_THREADS>(NAMED_BARRIER_TURN_WG0 + (wg + 1) % CONSUMERS);
}

// Key tile j of work tile wt needs a mask when it is the tail tile (keys past N_k; MODEL: the
// sequence's, wt.n_k, so a packed sequence's last tile is masked even where its keys fill it and
// the next sequence's follow), or has a key past the diagonal of the warpgroup's first row
// (causal) or past its window (MODEL: the row as a key index, diagonal_shift(), plus
// window_right), or before the window of the warpgroup's last row (its diagonal minus
// window_left; EXTRAS only). The tiles in between, every row seeing every key, go unmasked.
template <int BC, bool MODEL, bool EXTRAS>
__device__ __forceinline__ bool needs_mask(const problem &pb, const work_tile &wt,
                                           const consumer_place &p, int j) {
    const int key0 = key_tile_start<BC>(wt, j);
    if constexpr (MODEL) {
        const int diagonal0 = warpgroup_row0(wt, p) + diagonal_shift(wt);  // its first row's
        return key0 + BC > wt.n_k ||
               (pb.window_right >= 0 && key0 + BC - 1 > diagonal0 + pb.window_right) ||
               (EXTRAS && pb.window_left >= 0 && key0 < diagonal0 + (WGMMA_M - 1) - pb.window_left);
    } else {
        return key0 + BC > pb.N || (pb.causal && key0 + BC - 1 > warpgroup_row0(wt, p));
    }
}

// S_j has landed (its wgmma waited for): release K_j (ring slot st), and Q after its last use;
// softcap (MODEL with EXTRAS, where asked), then mask where needed, and take the rows' new max
// (row_max).
// Neither O_acc nor P is touched: the P V before may still be in flight; r says what exp_pack and
// rescale_o do later.
template <int BC, int QB, bool MODEL, bool EXTRAS, int EARLY>
__device__ __forceinline__ void scores_done(float (&S)[BC / 2], float (&m_i)[2], row_step<EARLY> &r,
                                            const smem_tiles &sm, const consumer_place &p,
                                            const problem &pb, const work_tile &wt, int j, int st) {
    pin_registers(S);
    release(bar_at(sm, BAR_K_EMPTY + st), p);
    if (j == wt.n_tiles - 1)
        release(bar_at(sm, BAR_Q_EMPTY + pipeline_state<QB>{wt.t}.slot()), p);  // Q's last use
    if constexpr (MODEL) {
        // softcap before the mask, so that a masked score stays -inf
        if (EXTRAS && pb.softcap_scale != 0.f) cap_scores<BC>(S, pb.softcap_scale);
        if (needs_mask<BC, MODEL, EXTRAS>(pb, wt, p, j))
            mask_window<BC>(S, p, row_of(wt, p) + diagonal_shift(wt), key_tile_start<BC>(wt, j),
                            wt.n_k, EXTRAS ? pb.window_left : -1, pb.window_right);
    } else {
        if (needs_mask<BC, MODEL, EXTRAS>(pb, wt, p, j))
            mask_scores<BC>(S, p, row_of(wt, p), key_tile_start<BC>(wt, j), pb.N, pb.causal);
    }
    row_max<BC, EARLY>(S, m_i, pb.scale_log2, r);
}

// The block's t-th work tile: wait until its Q has landed and its index is published. False
// means "stop": no work tiles are left.
template <int C, int BC, int QB, bool MODEL>
__device__ __forceinline__ bool take_work(const smem_tiles &sm, const consumer_place &p,
                                          const problem &pb, int works, int t, work_tile &wt) {
    const pipeline_state<QB> q = {t};
    wait_full(sm, BAR_Q_FULL, q);
    // (Q_FULL orders this read after the producer's write, Q_EMPTY the next write after it)
    const int w = read_work_slot_by_warp(&sm.work[q.slot()], p.lane);
    if (w >= works) return false;
    wt = work_at<C, BC, MODEL>(w, pb);
    wt.t = t;
    return true;
}

// A work tile's rows start from nothing: O = 0, m = -inf, l = 0.
template <int D>
__device__ __forceinline__ void start_rows(float (&O_acc)[D / 2], float (&m_i)[2],
                                           float (&l_i)[2]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) O_acc[i] = 0.f;
    m_i[0] = m_i[1] = -INFINITY;
    l_i[0] = l_i[1] = 0.f;
}

/* ---- the consumers' schedules ---------------------------------------------------------------- */

enum { SCHEDULE_SERIAL, SCHEDULE_OVERLAPPED, SCHEDULE_PINGPONG };

// Serial (variant nooverlap): each work tile, each key tile in turn: S = Q K^T, softmax,
// O += P V, every wgmma waited for at once. The tensor pipe idles during this warpgroup's softmax
// unless the other warpgroup happens to fill it.
template <int D, int C, int BC, bool BF16, bool MODEL, bool EXTRAS>
__device__ __forceinline__ void consumer_serial(const smem_tiles &sm, const consumer_place &p,
                                                const problem &pb, int works) {
    constexpr int QB = q_buffers<D, C, BC>();
    work_tile wt;
    for (int t = 0, it = 0; take_work<C, BC, QB, MODEL>(sm, p, pb, works, t, wt); ++t) {
        float O_acc[D / 2], m_i[2], l_i[2];
        start_rows<D>(O_acc, m_i, l_i);
        for (int j = 0; j < wt.n_tiles; ++j, ++it) {
            const kv_pipeline kv = {it};
            const int st = kv.slot();
            float S[BC / 2];
            uint32_t P[BC / 4];
            row_step<early_chunks<C>()> r;

            wait_full(sm, BAR_K_FULL, kv);
            issue_scores<D, C, BC, BF16>(
                S, scores_operands_of<D, C, BC>(sm, p, wt, k_stage<D, BC>(sm, st)));
            wgmma_wait<0>();
            scores_done<BC, QB, MODEL, EXTRAS>(S, m_i, r, sm, p, pb, wt, j, st);
            rescale_o<D>(O_acc, r.alpha);
            exp_pack<BC, early_chunks<C>(), BF16>(S, P, l_i, pb.scale_log2, r);

            wait_full(sm, BAR_V_FULL, kv);
            issue_pv<D, BC, BF16>(O_acc, P, pv_operand_of<D, BC>(sm, st), 1);
            wgmma_wait<0>();
            pin_registers(O_acc);
            release(bar_at(sm, BAR_V_EMPTY + st), p);
        }
        epilogue<D, C, BC, BF16, MODEL>(O_acc, m_i, l_i, p, sm, wt, pb);
    }
}

// Where O's rescale runs in the overlapped schedule. Mostly in retire_pv(), beside the
// exponentials, as soon as the P V before is done. Past D = 128 (128 multiplies a thread at D =
// 256; FlashAttention-4's order on sm_90 for these head dims), and at D = 96 with three consumers,
// in the next turn instead: between the issue of S = Q K^T and that of P V, so that it runs while
// the tensor cores work on S, off the path from the P V's wait to the next issue. With two
// consumers at D <= 128 that cost more than it saved (LOG.md, step 35).
template <int D, int C>
__device__ __forceinline__ constexpr bool rescale_before_pv() {
    return D > 128 || (D == 96 && C == 3);
}

// The overlapped schedule's steps, in the order consumer_overlapped() takes them. `it` counts the
// key tiles the block has gone through (the K/V ring's kv_pipeline), j is the key tile's index in
// its work tile. With PINGPONG, the warpgroups take turns at issuing their GEMMs.

// The block's first key tile: S = Q K_0^T only, nothing to overlap with yet; then its row max.
template <int D, int C, int BC, bool PINGPONG, bool BF16, bool MODEL, bool EXTRAS>
__device__ __forceinline__ void first_scores(float (&S)[BC / 2], float (&m_i)[2],
                                             row_step<early_chunks<C>()> &r, const smem_tiles &sm,
                                             const consumer_place &p, const problem &pb,
                                             const work_tile &wt) {
    const kv_pipeline first = {0};
    wait_full(sm, BAR_K_FULL, first);
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_scores<D, C, BC, BF16>(
        S, scores_operands_of<D, C, BC>(sm, p, wt, k_stage<D, BC>(sm, first.slot())));
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    wgmma_wait<0>();
    scores_done<BC, q_buffers<D, C, BC>(), MODEL, EXTRAS>(S, m_i, r, sm, p, pb, wt, 0,
                                                          first.slot());
}

// A work tile whose last P V was issued while the next work tile's rows went on (end_rows): what
// its epilogue needs once that P V is done (retire_pv). A packed batch's kernels write its LSE as
// its rows end and keep 1 / l (lse_at_rows_end): fewer registers across the main loop and in the
// epilogue, where they also hold the work tile's sequence, and the D = 256 consumers have none to
// spare.
typedef struct {
    bool due;      // the P V in flight is this work tile's last: its epilogue comes next
    work_tile wt;  // the work tile
    float m[2];    // its rows' max (not lse_at_rows_end)
    float l[2];    // its rows' sum (lse_at_rows_end: 1 / the sum, its LSE written: finish_rows)
} finished_tile;

// Whether a work tile's LSE is written as its rows end (end_rows), rather than with its O: a packed
// batch's kernels (is_packed, a constant in every kernel).
template <bool MODEL>
__device__ __forceinline__ bool lse_at_rows_end(const problem &pb) {
    return MODEL && is_packed(pb);
}

// The epilogue of the finished work tile: its O, and its LSE unless written as its rows ended.
template <int D, int C, int BC, bool BF16, bool MODEL>
__device__ __forceinline__ void finished_epilogue(const float (&O_acc)[D / 2],
                                                  const finished_tile &done,
                                                  const consumer_place &p, const smem_tiles &sm,
                                                  const problem &pb) {
    if (lse_at_rows_end<MODEL>(pb))
        store_o<D, C, BC, BF16, MODEL>(O_acc, done.l, p, sm, done.wt, pb);
    else
        epilogue<D, C, BC, BF16, MODEL>(O_acc, done.m, done.l, p, sm, done.wt, pb);
}

// The P V of key tile it - 1 is done: P and O_acc are free. Release that tile's V; if that P V
// ended a work tile (done.due), write that work tile's O and LSE; then the softmax of key tile it
// goes on: O *= alpha (here unless rescale_before_pv), and P = fp16(2^(S - m)) with l (exp_pack).
// In one basic block, the compiler interleaves the exponentials (MUFU) with the rescale and the
// packing (LOG.md, step 18).
template <int D, int C, int BC, bool BF16, bool MODEL>
__device__ __forceinline__ void retire_pv(float (&O_acc)[D / 2], uint32_t (&P)[BC / 4],
                                          const float (&S)[BC / 2], float (&l_i)[2],
                                          const row_step<early_chunks<C>()> &r,
                                          const finished_tile &done, const smem_tiles &sm,
                                          const consumer_place &p, const problem &pb, int it) {
    wgmma_wait<0>();
    pin_registers(O_acc);
    pin_registers(P);
    const kv_pipeline kv = {it};
    if (kv.count > 0) release(bar_at(sm, BAR_V_EMPTY + kv.previous().slot()), p);
    if (done.due) finished_epilogue<D, C, BC, BF16, MODEL>(O_acc, done, p, sm, pb);
    if constexpr (!rescale_before_pv<D, C>())
        rescale_o<D>(O_acc, r.alpha);  // (alpha is 0 on a work tile's first key tile: see issue_pv)
    exp_pack<BC, early_chunks<C>(), BF16>(S, P, l_i, pb.scale_log2, r);
}

// Work tile wt's rows end with the P V of its last key tile, about to be issued: keep their m
// and l for its epilogue (retire_pv, once that P V is done; lse_at_rows_end: write their LSE now,
// which needs no O, and keep 1 / l), and start the next work tile's rows (O_acc restarts in
// issue_pv).
template <bool MODEL>
__device__ __forceinline__ void end_rows(finished_tile &done, float (&m_i)[2], float (&l_i)[2],
                                         const work_tile &wt, const consumer_place &p,
                                         const problem &pb) {
    done.due = true;
    done.wt = wt;
    if (lse_at_rows_end<MODEL>(pb))
        finish_rows<MODEL>(m_i, l_i, p, wt, pb, done.l);
    else
        done.m[0] = m_i[0], done.m[1] = m_i[1], done.l[0] = l_i[0], done.l[1] = l_i[1];
    m_i[0] = m_i[1] = -INFINITY, l_i[0] = l_i[1] = 0.f;
}

// The key tile after key tile j of work tile wt: j + 1 of wt, or, after wt's last (its rows end:
// end_rows), key tile 0 of the block's next work tile (take_work). False when there is none: the
// block is done. The work tile's end is this branch, taken once per work tile; in the pass that
// the loop runs most it costs a compare.
template <int C, int BC, int QB, bool MODEL>
__device__ __forceinline__ bool next_key_tile(const smem_tiles &sm, const consumer_place &p,
                                              const problem &pb, int works, const work_tile &wt,
                                              int j, work_tile &next, int &next_j,
                                              finished_tile &done, float (&m_i)[2],
                                              float (&l_i)[2]) {
    next = wt;
    next_j = j + 1;
    if (next_j == wt.n_tiles) {
        end_rows<MODEL>(done, m_i, l_i, wt, p, pb);
        next_j = 0;
        if (!take_work<C, BC, QB, MODEL>(sm, p, pb, works, wt.t + 1, next)) return false;
    }
    return true;
}

// One turn: issue S = Q K^T of the next key tile (work tile `next`, the block's (it + 1)-th) and
// O += P V of key tile it (index j in its work tile), two wgmma groups back to back (with
// rescale_before_pv, O *= alpha between them). Returns the ring slot of the K it reads.
template <int D, int C, int BC, bool PINGPONG, bool BF16>
__device__ __forceinline__ int issue_turn(float (&S)[BC / 2], float (&O_acc)[D / 2],
                                          const uint32_t (&P)[BC / 4], const smem_tiles &sm,
                                          const consumer_place &p, const work_tile &next, int it,
                                          int j, const float (&alpha)[2]) {
    const kv_pipeline kv = {it}, kv_next = {it + 1};
    const int st = kv.slot(), next_st = kv_next.slot();

    const scores_operands next_scores =
        scores_operands_of<D, C, BC>(sm, p, next, k_stage<D, BC>(sm, next_st));
    const uint64_t V_desc = pv_operand_of<D, BC>(sm, st);
    wait_full(sm, BAR_K_FULL, kv_next);
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_scores<D, C, BC, BF16>(S, next_scores);
    if constexpr (rescale_before_pv<D, C>()) rescale_o<D>(O_acc, alpha);
    wait_full(sm, BAR_V_FULL, kv);
    issue_pv<D, BC, BF16>(O_acc, P, V_desc, j > 0);
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    return next_st;
}

// The block's last key tile (the it-th): O += P V only (O *= alpha first with rescale_before_pv),
// then the last work tile's epilogue.
template <int D, int C, int BC, bool PINGPONG, bool BF16, bool MODEL>
__device__ __forceinline__ void last_pv(float (&O_acc)[D / 2], const uint32_t (&P)[BC / 4],
                                        const finished_tile &done, const smem_tiles &sm,
                                        const consumer_place &p, const problem &pb, int it, int j,
                                        const float (&alpha)[2]) {
    const kv_pipeline kv = {it};
    const int st = kv.slot();
    if constexpr (rescale_before_pv<D, C>()) rescale_o<D>(O_acc, alpha);
    wait_full(sm, BAR_V_FULL, kv);
    if (PINGPONG) pingpong_wait_turn(p.wg);
    issue_pv<D, BC, BF16>(O_acc, P, pv_operand_of<D, BC>(sm, st), j > 0);
    if (PINGPONG) pingpong_pass_turn<C>(p.wg);
    wgmma_wait<0>();
    pin_registers(O_acc);
    release(bar_at(sm, BAR_V_EMPTY + st), p);
    finished_epilogue<D, C, BC, BF16, MODEL>(O_acc, done, p, sm, pb);
}

// Overlapped (default; nopingpong without the turn-taking): one pipeline over every key tile the
// block consumes, across its work tiles. Each turn issues S = Q K^T of the next key tile with
// O += P V of this one, and the softmax of the next key tile starts while that P V is still in
// flight (FlashAttention-3's intra-warpgroup overlap): its row max reads S alone and leaves O_acc
// and P to the wgmma. The P V's wait opens the next pass (retire_pv; LOG.md, step 7), and there
// the exponentials, O's rescale (or in the next turn: rescale_before_pv) and P's packing run side
// by side (step 18). When a P V ends a work tile, the S issued beside it is already the next work
// tile's first (its Q is in the other Q buffer), and the finished work tile's O is written while
// the other warpgroups' GEMMs run.
template <int D, int C, int BC, bool PINGPONG, bool BF16, bool MODEL, bool EXTRAS>
__device__ __forceinline__ void consumer_overlapped(const smem_tiles &sm, const consumer_place &p,
                                                    const problem &pb, int works) {
    constexpr int QB = q_buffers<D, C, BC>();
    work_tile wt;
    if (!take_work<C, BC, QB, MODEL>(sm, p, pb, works, 0, wt)) return;
    // Warpgroup 0 takes the first turn: the last warpgroup hands it over before its own first wait.
    if (PINGPONG && p.wg == C - 1) pingpong_pass_turn<C>(p.wg);

    float O_acc[D / 2], S[BC / 2], m_i[2], l_i[2];
    uint32_t P[BC / 4];
    row_step<early_chunks<C>()> r;
    start_rows<D>(O_acc, m_i, l_i);
    first_scores<D, C, BC, PINGPONG, BF16, MODEL, EXTRAS>(S, m_i, r, sm, p, pb, wt);

    // A pass starts with S holding the scores of key tile j of work tile wt, the block's it-th,
    // m_i their row max and r the rest of row_max's results, while the P V of the key tile before
    // it may still run. If that P V ends a work tile (done.due), `done` is that work tile.
    finished_tile done = {false, wt, {0.f, 0.f}, {0.f, 0.f}};
    int it = 0, j = 0;
    for (;; ++it) {
        retire_pv<D, C, BC, BF16, MODEL>(O_acc, P, S, l_i, r, done, sm, p, pb, it);
        done.due = false;

        work_tile next;  // the work tile of the next key tile
        int next_j;
        if (!next_key_tile<C, BC, QB, MODEL>(sm, p, pb, works, wt, j, next, next_j, done, m_i, l_i))
            break;
        const int next_st =
            issue_turn<D, C, BC, PINGPONG, BF16>(S, O_acc, P, sm, p, next, it, j, r.alpha);
        wgmma_wait<1>();  // S of the next key tile is done; P V may still run
        scores_done<BC, QB, MODEL, EXTRAS>(S, m_i, r, sm, p, pb, next, next_j, next_st);
        wt = next;
        j = next_j;
    }
    // (next_key_tile ended wt's rows: done has what their epilogue needs)
    last_pv<D, C, BC, PINGPONG, BF16, MODEL>(O_acc, P, done, sm, p, pb, it, j, r.alpha);

    // Every turn was handed on; warpgroup 0 takes the last warpgroup's final hand-over, so that no
    // arrival is left pending on its barrier.
    if (PINGPONG && p.wg == 0) pingpong_wait_turn(p.wg);
}

// One consumer thread: its place in the block, then its schedule over the block's work tiles.
template <int D, int C, int BC, int SCHEDULE, bool BF16, bool MODEL, bool EXTRAS>
__device__ __forceinline__ void consumer(const smem_tiles &sm, const problem &pb, int works) {
    const consumer_place p = consumer_place_of_thread();
    if (SCHEDULE == SCHEDULE_SERIAL)
        consumer_serial<D, C, BC, BF16, MODEL, EXTRAS>(sm, p, pb, works);
    else
        consumer_overlapped<D, C, BC, (SCHEDULE == SCHEDULE_PINGPONG && C > 1), BF16, MODEL,
                            EXTRAS>(sm, p, pb, works);
    // The O stores still in flight read the shared memory the block is about to give up.
    if (o_staged<D, C, BC>() && p.lane == 0) bulk_wait<false>();
}
