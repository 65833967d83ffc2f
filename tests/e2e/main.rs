//! The end-to-end tests, one test binary (`cargo test --test e2e`; link time dominates a test
//! build, issue #34): the built `miles` and `miles-engine` plan, train, serve and report, in
//! process, in worker processes, under Slurm and Ray (`slurm`, `ray`: skipped, saying why, when
//! scripts/start-test-slurm.sh or scripts/start-test-ray.sh has not started one) and on a GPU
//! (`gpu`: the refusal or the CPU fallback without one; bench/gpu/run.sh runs `gpu::` on a GPU
//! machine). Each module was a test binary of its own; `cargo test --test e2e MODULE::` runs one.
//! tests/plan_vs_actual.rs stays a binary of its own: it times a run's steps, so nothing may run
//! beside it.

#[path = "../common/mod.rs"]
mod common;

mod agent_hf;
mod agent_layers;
mod algorithms;
mod cli_plan_run;
mod combined_rewards;
mod data;
mod ddp;
mod diffusion;
mod distributed;
mod faults;
mod gpu;
mod hf_hub;
mod hf_moe;
mod hf_recipe;
mod hf_weight_updates;
mod interrupt;
mod lora;
mod moe;
mod opd;
mod parquet_shards;
mod ppo;
mod ray;
mod real_clients;
mod samples;
mod serve;
mod slurm;
