/*
 * csv_header.h: the one home of the results CSV's columns. The program prints this header;
 * plots/sweep.sh, plots/sdpa_baseline.py and the tests' fixtures read it from this file (the
 * string between the quotes below), so a column added here reaches all of them.
 *
 *   pass: fwd (the forward pass), bwd (the backward pass alone, given O and LSE), fwd+bwd
 *         (both, as one training step runs them). Readers take a missing pass column as fwd.
 *   tflops: 4 B H N^2 D (halved when causal) per forward, with a local window 4 B H D times the
 *         (query, key) pairs attended; a backward counts 2.5 times that. A run's local window and
 *         softcap are not columns (the sweeps run none): the run's description names them.
 */
#ifndef CSV_HEADER_H
#define CSV_HEADER_H
// clang-format off: one line, so that scripts can read it
#define CSV_HEADER "gpu,stage,variant,pass,B,H,N,D,causal,dtype,ms_median,ms_min,repeats,tflops,max_abs_err,rel_err,lse_err,rows_checked,device_mb,status"
// Stage 10's program (common/ring_main.c, --csv): a row per shape, its lines prefixed "csv," among
// the others; the ring's times beside the ring of one's, and the efficiencies T_1 / (P T_P)
#define RING_CSV_HEADER "gpu,gpus,layout,inner,B,H,H_kv,N,D,causal,dtype,fwd_ms,fwd_ms_1gpu,fwd_efficiency,bwd_ms,bwd_ms_1gpu,fwd_bwd_efficiency"
// clang-format on
#endif
