//! The capability matrix as data: for every field of every std stage kind and schema, which
//! targets execute it. Adding a stdlib field without a row here fails
//! `every_stdlib_field_has_a_row`; a row that claims execution names the behaviour tests that
//! exercise it (`tested_by`, checked to exist).

use super::rules::*;
use super::Ctx;
use super::Target;
use crate::value::FieldValue;

pub(super) const E: Target = Target::Embedded;
pub(super) const W: Target = Target::Workers;
pub(super) const H: Target = Target::Http;

pub enum Support {
    /// Executed on every runnable target.
    All,
    /// Executed on these targets; elsewhere refused unless it keeps one of the listed values.
    Only(&'static [Target], &'static [&'static str]),
    /// Executed nowhere yet (planned for GPU clusters only): refused unless it keeps one of
    /// these values.
    Refused(&'static [&'static str]),
    /// Read by the planner (hardware, catalogs, cluster sizes): changes nothing a run does.
    Describes,
    /// Executed for some values: the rule says why a value is refused on a target.
    Rule(fn(&Ctx, &FieldValue) -> Option<String>),
}

impl Support {
    pub fn cell(&self, t: Target) -> String {
        let keeps = |k: &[&str]| {
            if k.is_empty() {
                "no".to_string()
            } else {
                format!("no (only `{}`)", k.join("`, `"))
            }
        };
        match self {
            Support::All => "yes".into(),
            Support::Only(ts, k) if ts.contains(&t) => "yes".into(),
            Support::Only(_, k) | Support::Refused(k) => keeps(k),
            Support::Describes => "describes".into(),
            Support::Rule(_) => "rule".into(),
        }
    }
}

pub struct Entry {
    /// A stage kind or schema of the stdlib (`generate`, `adam`, `recipe_settings`).
    pub owner: &'static str,
    /// A field; empty for the stage kind or schema itself.
    pub field: &'static str,
    pub support: Support,
    /// Why and how to fix, shown as the diagnostic's help and in the matrix.
    pub note: &'static str,
    /// Tests (function names) that show the field changes what a run does.
    pub tested_by: &'static [&'static str],
}

impl Entry {
    /// Why `cx.target` does not execute this field's value (`None` for the owner itself).
    pub fn refuses(&self, cx: &Ctx, f: Option<&FieldValue>) -> Option<String> {
        if f.is_some_and(|f| f.defaulted) {
            return None;
        }
        let kept = |keeps: &[&str]| f.is_some_and(|f| keeps.contains(&f.value.to_string().as_str()));
        match &self.support {
            Support::All | Support::Describes => None,
            Support::Only(ts, _) if ts.contains(&cx.target) => None,
            Support::Only(_, keeps) | Support::Refused(keeps) if kept(keeps) => None,
            Support::Only(..) | Support::Refused(_) => Some(self.note.to_string()),
            Support::Rule(rule) => f.and_then(|f| rule(cx, f)),
        }
    }
}

/// The row of `owner.field`, else the owner's `*` row (every field alike).
pub fn lookup(owner: &str, field: &str) -> Option<&'static Entry> {
    let row = |f: &str| TABLE.iter().find(|e| e.owner == owner && e.field == f);
    row(field).or_else(|| if field.is_empty() { None } else { row("*") })
}

const fn e(
    owner: &'static str,
    field: &'static str,
    support: Support,
    note: &'static str,
    tested_by: &'static [&'static str],
) -> Entry {
    Entry { owner, field, support, note, tested_by }
}

pub(super) const TRAINS: &[&str] =
    &["same_seed_gives_identical_metrics", "one_engine_in_worker_processes_learns_bit_identically_to_in_process"];
pub(super) const TASKS: &[&str] = &["arithmetic_is_correct_and_splits_are_disjoint", "string_tasks"];
pub(super) const DESCRIBES: &str = "read by `miles plan`; a run on this machine does not depend on it";

/// Built-in prompt sets the runtime generates or reads.
pub(super) const RUNNABLE_PROMPTS: &[&str] = &["addition", "multiplication", "reverse", "sort", "jsonl", "parquet"];
/// Tests of runs that start from a Hugging Face directory with data files and reward stages.
pub(super) const BYO: &[&str] =
    &["hf_recipe_runs_end_to_end", "grpo_from_an_hf_directory_with_a_command_reward_exports_a_reloadable_model"];
pub(super) const BYO_PARQUET: &[&str] = &["a_parquet_and_verify_recipe_runs_and_a_bad_directory_is_a_check_error"];
/// Tests of a datasets repository's held-out rows (`held_out`): shipped test shards, or drawn.
const HELD_OUT: &[&str] = &[
    "held_out_drawn_ignores_the_test_shards_and_draws_from_the_train_rows",
    "a_run_from_a_sharded_datasets_repository_holds_out_its_test_shards",
    "held_out_drawn_evaluates_on_train_shard_rows",
];
/// Tests of a prompt file's split rule (`split_by`): its counts, and a run it makes work.
const SPLIT_BY: &[&str] =
    &["split_by_row_keeps_every_row", "a_shared_prompt_file_shows_its_dedup_and_runs_split_by_row"];
const R3_WHERE: &str = "routed experts are recorded by the embedded engine, in `miles run` or in worker processes; an SGLang server given by URL returns no routing here: remove the field, or drop the URL engine";
/// Tests that a seeded MoE exports as transformers' qwen3_moe or mixtral, and that what neither
/// holds is refused.
const MOE_EXPORT: &[&str] =
    &["a_seeded_moe_policy_exports_with_the_fixtures_structure", "export_refuses_what_no_transformers_class_holds"];
pub(super) const HF_WHERE: &str = "a Hugging Face model is loaded by the embedded backend, in `miles run` or in worker processes; a run whose rollout is served by URL does not load one yet";

/// Tests that show LoRA changes what a run does (adapters trained and synced, exported, resumed).
pub(super) const LORA_TESTS: &[&str] = &[
    "lora_trains_only_the_adapters_and_syncs_adapter_bytes",
    "lora_forward_matches_peft",
    "lora_recipe_runs_exports_peft_and_resumes",
    "lora_in_worker_processes_trains_bit_identically_to_in_process",
    "lora_under_fully_async_syncs_adapters_only",
];
/// Tests that show distillation from a teacher changes what a run does.
pub(super) const OPD_TESTS: &[&str] = &["opd_advantage_by_hand", "an_opd_recipe_distils_through_the_binary"];

/// Tests that show PPO's critic and advantages change what a run does.
pub(super) const PPO_TESTS: &[&str] =
    &["ppo_critic_learns_values_and_resumes_exactly", "a_ppo_recipe_runs_and_learns_through_the_binary"];
/// Tests that show several adapters train apart on their own tasks.
pub(super) const MULTI_LORA_TESTS: &[&str] =
    &["multi_lora_adapters_train_apart", "a_multi_lora_recipe_runs_each_adapter_on_its_own_task"];
pub(super) const LORA_WHERE: &str = "LoRA runs on the embedded backend, in `miles run` or in worker processes; engines served by URL take no adapter updates yet";

/// Tests of recipes whose rollouts are episodes against an environment.
pub(super) const EPISODES: &[&str] =
    &["a_run_of_calculator_episodes_trains_and_reports_how_episodes_ended", "the_agent_recipe_checks_plans_and_runs"];
/// ... and under the asynchronous schedules.
pub(super) const EPISODES_ASYNC: &[&str] = &[
    "a_run_of_calculator_episodes_trains_and_reports_how_episodes_ended",
    "the_agent_recipe_checks_plans_and_runs",
    "fully_async_episodes_refill_per_episode_and_keep_per_token_versions",
    "a_compacting_agent_recipe_plans_and_runs_under_fully_async",
];
/// Tests of compacted episodes (a new TITO chain per compaction).
pub(super) const COMPACTION: &[&str] = &[
    "a_compacted_episode_branches_into_a_new_chain",
    "compacted_episodes_train_end_to_end",
    "a_compacting_agent_recipe_plans_and_runs_under_fully_async",
];
/// Tests of samples.jsonl: its rows, its resume, its report.
pub(super) const SAMPLES_TESTS: &[&str] = &[
    "single_turn_rows_show_prompt_response_reward_and_the_dropped_one_first",
    "an_episode_row_has_its_transcript_tool_calls_and_fault",
    "resume_cuts_samples_back_to_the_checkpoint",
    "samples_jsonl_is_written_and_shown_by_the_report",
];
pub(super) const PY_ENV: &[&str] = &["a_python_environment_drives_a_run_end_to_end"];
/// The environment schemas the runtime plays (std/prelude).
pub(super) const RUNNABLE_ENVS: &[&str] =
    &["calculator", "command_env", "openenv", "agent_program", "rollout_program", "external_agents", "verifiers"];
/// The plug-in layers: the user's programs (or an outside process) play episodes through the
/// run's chat server, which the synchronous executor serves between programs.
pub(super) const AGENT_LAYERS: &[&str] = &["agent_program", "rollout_program", "external_agents", "verifiers"];
/// Tests of the `verifiers` kind: its mapping onto the rollout program and its driver, the
/// refusal of `args` that are not a JSON object, and verifiers environments driving a run.
pub(super) const VERIFIERS: &[&str] = &["a_verifiers_env_runs_the_embedded_driver_as_a_rollout_program"];
pub(super) const VERIFIERS_RUN: &[&str] =
    &["a_verifiers_env_runs_the_embedded_driver_as_a_rollout_program", "verifiers_envs_drive_miles_run"];
/// Tests of the plug-in layers' program protocol and faults.
pub(super) const AGENT_LAYER_TESTS: &[&str] = &[
    "an_agent_reward_line_is_the_last_json_line",
    "program_faults_end_the_episode_with_a_reason_and_the_stderr_tail",
    "a_rollout_program_returns_one_reward_per_session",
];

/// Tests of group rewards and combinations (docs/rewards.md).
pub(super) const GROUP_COMMAND: &[&str] = &[
    "a_ranking_group_reward_changes_the_advantages_as_computed_by_hand",
    "a_group_program_gets_one_request_per_group_and_fails_it_whole",
    "combined_and_group_rewards_train_and_write_their_columns",
];
pub(super) const GROUP_HTTP: &[&str] = &["a_group_service_gets_one_request_per_group_and_fails_it_whole"];
pub(super) const COMBINE: &[&str] = &[
    "a_ranking_group_reward_changes_the_advantages_as_computed_by_hand",
    "a_weighted_sum_whose_failures_are_never_a_smaller_reward",
    "combined_and_group_rewards_train_and_write_their_columns",
];

/// Tests that show a diffusion recipe's fields change what its run does.
pub(super) const DIFFUSION_RUN: &[&str] =
    &["a_diffusion_recipe_runs_through_the_binary", "diffusion_recipe_fields_reach_the_spec"];
pub(super) const DIFFUSION_WHERE: &str = "diffusion RL runs in the `miles run` process (the in_process launcher); worker processes and URL engines do not host a denoiser yet: remove the launcher";

/// Tests that show data-parallel trainer ranks train as one process would (engine/tch's ranks as
/// threads, and worker processes end to end).
pub(super) const DP_TESTS: &[&str] = &[
    "two_and_four_ranks_match_one_process",
    "repeats_are_bit_identical",
    "two_ranks_train_as_one_process_and_repeat_bit_identically",
    "two_ranks_under_slurm_and_ray_train_as_under_local_processes",
];
/// ... and that ZeRO-1's sharded optimizer steps as the whole one does, its checkpoint resuming
/// on another rank count.
pub(super) const ZERO_TESTS: &[&str] = &[
    "zero_one_matches_plain_dp_with_a_shard_of_the_optimizer",
    "zero_checkpoint_of_two_ranks_resumes_on_one_and_on_four",
];
/// Tests that a rank killed, stopped or never joining stops the run within the collective
/// deadline, named.
pub(super) const DP_FAULT_TESTS: &[&str] = &[
    "a_rank_that_never_joins_fails_the_rendezvous_in_bounded_time",
    "a_killed_rank_stops_the_run_named_and_resume_finishes_it",
    "a_stopped_rank_stops_the_run_named_and_resume_finishes_it_on_one_rank",
];

/// A value whose code is built and tested only in its refusal half: it has never run on the
/// hardware it needs (the machines its tests ran on have no GPU). The matrix shows it as "built,
/// never run" and `miles check` warns (E0519) where a recipe relies on it, until a run on that
/// hardware records it (bench/RESULTS.md): then its entry goes.
pub struct Unproven {
    /// The row it qualifies (`local`, `device`).
    pub owner: &'static str,
    pub field: &'static str,
    /// The value as `miles check` prints it (`cuda`).
    pub value: &'static str,
    /// What has never run, shown as the warning's help.
    pub note: &'static str,
    /// The tests whose hardware half, once run where the hardware is, records it.
    pub proven_by: &'static [&'static str],
}

impl Unproven {
    /// The entry for `owner.field` set (not defaulted) to its value, if any.
    pub fn of(owner: &str, field: &str, f: &FieldValue) -> Option<&'static Unproven> {
        if f.defaulted {
            return None;
        }
        let value = f.value.to_string();
        UNPROVEN.iter().find(|u| u.owner == owner && u.field == field && u.value == value)
    }
}

pub const UNPROVEN: &[Unproven] = &[
    Unproven {
        owner: "local",
        field: "device",
        value: "cuda",
        note: "the embedded backend on a GPU is built and its refusals tested, but it has never trained on a GPU: its tests ran on machines without one (docs/gpu.md). Expect the first run to find what they could not",
        proven_by: &["the_laptop_recipe_learns_on_cuda_as_on_cpu"],
    },
    Unproven {
        owner: "weights",
        field: "channel",
        value: "nccl",
        note: "the NCCL weight channel is built and its refusals tested, but it has never broadcast between GPUs: its tests ran on machines without one (docs/distributed.md). `broadcast` over TCP or `shm` are the channels that have run",
        proven_by: &["nccl_channel_names_the_missing_library_or_broadcasts_between_two_gpus"],
    },
];

pub const TABLE: &[Entry] = &[
    // ---- std/stages: diffusion -------------------------------------------------------------
    e("denoise_pretrain", "", Support::Only(&[E], &[]), DIFFUSION_WHERE, &["pretraining_on_a_tiny_dataset_lowers_the_loss"]),
    e("denoise_pretrain", "seed", Support::All, "", &["the_pretraining_seed_fixes_what_rl_starts_from"]),
    e("denoise_pretrain", "*", Support::All, "", DIFFUSION_RUN),
    e("denoise", "", Support::Only(&[E], &[]), DIFFUSION_WHERE, &["sample_is_seeded_and_rows_do_not_depend_on_their_batch"]),
    e("denoise", "*", Support::All, "", DIFFUSION_RUN),
    e("image_reward", "", Support::Only(&[E], &[]), DIFFUSION_WHERE, &["the_classifier_learns_the_domain_and_round_trips"]),
    e("image_reward", "streaming", Support::All, "", &["streamed_rewards_give_the_whole_batch_run_exactly"]),
    e("image_reward", "classifier", Support::All, "", &["streamed_rewards_give_the_whole_batch_run_exactly", "bad_diffusion_specs_are_refused_before_any_work"]),
    e("image_reward", "analytic", Support::All, "", &["analytic_rewards_match_hand_computed_values"]),
    e("image_reward", "extra_cost", Support::All, "", &["the_extra_cost_is_slept_after_the_real_work"]),
    e("image_reward", "process", Support::All, "", &["the_reward_in_a_worker_process_rewards_alike_and_survives_a_kill"]),
    e("image_reward", "*", Support::All, "", DIFFUSION_RUN),
    e("diffusion_grpo", "", Support::Only(&[E], &[]), DIFFUSION_WHERE, &["an_rl_step_raises_the_logprob_of_the_better_images"]),
    e("diffusion_grpo", "clip", Support::All, "", &["ratio_and_clipping_on_three_samples_by_hand"]),
    e("diffusion_grpo", "std_norm", Support::All, "", &["group_advantages_of_two_groups_by_hand"]),
    e("diffusion_grpo", "kl_coef", Support::All, "", &["gaussian_kl_by_hand"]),
    e("diffusion_grpo", "*", Support::All, "", DIFFUSION_RUN),
    e("image_eval", "", Support::Only(&[E], &[]), DIFFUSION_WHERE, &["streamed_rewards_give_the_whole_batch_run_exactly"]),
    e("image_eval", "*", Support::All, "", DIFFUSION_RUN),
    // ---- std/stages ------------------------------------------------------------------------
    e("sft", "", Support::All, "supervised warm-up before RL", &["sft_lowers_the_loss_and_init_is_deterministic"]),
    e("sft", "data", Support::Rule(rule_sft_data), "SFT reads the rollout's prompt set (train split)", &["run_trains_and_a_saved_plan_runs_exactly"]),
    e("sft", "steps", Support::All, "", &["run_trains_and_a_saved_plan_runs_exactly"]),
    e("sft", "lr", Support::All, "", &["sft_lowers_the_loss_and_init_is_deterministic"]),
    e("sft", "batch", Support::All, "", &["sft_lowers_the_loss_and_init_is_deterministic"]),
    e("sft", "warmup", Support::All, "", &["lr_schedules"]),
    e("generate", "", Support::All, "", TRAINS),
    e("generate", "prompts", Support::Rule(rule_rollout_prompts), "built-in tasks, jsonl and parquet, train split", &["jsonl_task_runs_end_to_end"]),
    e("generate", "samples_per_prompt", Support::All, "", &["grpo_advantages_by_hand"]),
    e("generate", "max_new_tokens", Support::All, "", &["clear_errors_before_training"]),
    e("generate", "max_prompt_tokens", Support::All, "a prompt set whose longest prompt exceeds it stops before training", &["clear_errors_before_training"]),
    e("generate", "mean_response_tokens", Support::Describes, DESCRIBES, &[]),
    e("generate", "mean_prompt_tokens", Support::Describes, DESCRIBES, &[]),
    e("generate", "temperature", Support::All, "", &["kv_cache_and_full_recompute_sample_the_same"]),
    e("generate", "top_p", Support::All, "", &["kv_cache_and_full_recompute_sample_the_same"]),
    e("generate", "top_k", Support::All, "", &["kv_cache_and_full_recompute_sample_the_same"]),
    e("generate", "engine", Support::All, "the engine's own schema says where it runs", &["remote_stages_generate_train_and_sync_weights_with_every_transport"]),
    e("generate", "session", Support::Rule(rule_session), "", EPISODES),
    e("generate", "partial_rollout", Support::Refused(&["false"]), "partial rollouts are not executed yet: remove `partial_rollout` (fully_async's `pause = in_place` keeps requests across updates)", &[]),
    e("generate", "routing_replay", Support::Only(&[E, W], &["false"]), R3_WHERE, &["replayed_routing_equals_recorded", "gradients_flow_only_to_recorded_experts"]),
    e("generate", "record_routing", Support::Only(&[E, W], &["false"]), R3_WHERE, &["r3_bytes_match_the_plan"]),
    e("generate", "routing_dtype", Support::Only(&[E, W], &["none"]), R3_WHERE, &["r3_bytes_match_the_plan"]),
    e("generate", "batch_invariant", Support::Only(&[E, W], &["false"]), "an SGLang server's kernels are its own: batch-invariant sampling runs on the embedded engine", &["batch_invariant_logprobs_are_the_samplers_bit_for_bit"]),
    e("exact_match", "", Support::All, "", &["verifier"]),
    e("exact_match", "partial_credit", Support::All, "", &["verifier"]),
    e("verify", "", Support::All, "scored by the executor, whatever runs the stages", BYO_PARQUET),
    e("verify", "kind", Support::All, "", &["verifiers_score_batches_and_name_bad_labels"]),
    e("verify", "pattern", Support::All, "", &["verifiers_score_batches_and_name_bad_labels"]),
    e("verify", "schema_text", Support::All, "", &["verifiers_score_batches_and_name_bad_labels"]),
    e("verify", "on_error", Support::All, "", BYO_PARQUET),
    e("command_reward", "", Support::All, "scored by the executor, whatever runs the stages", BYO),
    e("command_reward", "command", Support::All, "", BYO),
    e("command_reward", "timeout", Support::All, "", &["malformed_answers_and_timeouts_follow_the_policy"]),
    e("command_reward", "on_error", Support::All, "", &["a_failing_reward_program_stops_the_run_naming_the_stage_and_sample"]),
    e("command_reward", "pass_env", Support::All, "", &["the_program_sees_the_allow_list_and_pass_env_not_the_run_secrets"]),
    e("http_reward", "", Support::All, "scored by the executor, whatever runs the stages", &["http_reward_scores_a_run"]),
    e("http_reward", "url", Support::All, "", &["http_reward_scores_a_run"]),
    e("http_reward", "concurrency", Support::All, "", &["batches_are_split_and_concurrency_is_bounded"]),
    e("http_reward", "batch_size", Support::All, "", &["http_reward_scores_a_run"]),
    e("http_reward", "timeout", Support::All, "", &["timeouts_malformed_answers_and_dead_services_follow_the_policy"]),
    e("http_reward", "retries", Support::All, "", &["server_errors_are_retried"]),
    e("http_reward", "on_error", Support::All, "", &["http_reward_scores_a_run"]),
    e("group_command_reward", "", Support::All, "scored by the executor, whatever runs the stages: one request per group", GROUP_COMMAND),
    e("group_command_reward", "command", Support::All, "", GROUP_COMMAND),
    e("group_command_reward", "timeout", Support::All, "", &["a_group_program_gets_one_request_per_group_and_fails_it_whole"]),
    e("group_command_reward", "on_error", Support::All, "", &["a_group_program_gets_one_request_per_group_and_fails_it_whole"]),
    e("group_command_reward", "pass_env", Support::All, "", &["a_group_program_gets_one_request_per_group_and_fails_it_whole"]),
    e("group_http_reward", "", Support::All, "scored by the executor, whatever runs the stages: one request per group", GROUP_HTTP),
    e("group_http_reward", "url", Support::All, "", GROUP_HTTP),
    e("group_http_reward", "concurrency", Support::All, "", GROUP_HTTP),
    e("group_http_reward", "timeout", Support::All, "", GROUP_HTTP),
    e("group_http_reward", "retries", Support::All, "", GROUP_HTTP),
    e("group_http_reward", "on_error", Support::All, "", GROUP_HTTP),
    e("combine", "", Support::All, "scored by the executor: every part on the whole batch, groups intact", COMBINE),
    e("combine", "parts", Support::Rule(rule_combine_parts), "every reward stage kind but `env_reward`", COMBINE),
    e("combine", "weights", Support::All, "", COMBINE),
    e("env_reward", "", Support::Only(&[E], &[]), "episodes are played by `miles run` in one process: drop the launcher / URL engine", EPISODES),
    e("env_reward", "env", Support::Rule(rule_env), "the runtime plays `calculator`, `command_env` and `openenv` environments, under every schedule", EPISODES_ASYNC),
    e("env_reward", "max_turns", Support::All, "", &["limits_end_episodes"]),
    e("env_reward", "mean_turns", Support::Describes, DESCRIBES, &[]),
    e("env_reward", "observation_tokens", Support::Describes, DESCRIBES, &[]),
    e("env_reward", "solved_at", Support::All, "", &["the_success_rule_is_a_setting_with_a_stated_default", "the_success_rule_sets_what_eval_and_solved_frac_count"]),
    e("env_reward", "concurrency", Support::All, "", &["many_episodes_over_one_process"]),
    e("env_reward", "turn_timeout", Support::All, "", &["environment_faults_end_their_episode_not_the_run"]),
    e("env_reward", "timeout", Support::All, "", &["environment_faults_end_their_episode_not_the_run"]),
    e("env_reward", "tool_format", Support::All, "", &["hermes_calls"]),
    e("env_reward", "reward", Support::All, "", &["limits_end_episodes"]),
    e("env_reward", "on_env_error", Support::All, "", &["environment_faults_end_their_episode_not_the_run"]),
    e("env_reward", "prompt", Support::All, "", &["a_rows_chat_prompt_reaches_the_episodes_first_turn"]),
    e("env_reward", "compact", Support::All, "", COMPACTION),
    e("grpo", "", Support::All, "", TRAINS),
    e("grpo", "rollout_batch", Support::All, "", TRAINS),
    e("grpo", "global_batch", Support::All, "", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("grpo", "steps_per_rollout", Support::All, "optimizer steps per rollout = rollout_batch x samples / global_batch", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("grpo", "micro_batch", Support::All, "", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("grpo", "lr", Support::All, "", &["lr_schedules"]),
    e("grpo", "clip_low", Support::All, "", &["clipped_loss_with_asymmetric_clip_by_hand"]),
    e("grpo", "clip_high", Support::All, "", &["clipped_loss_with_asymmetric_clip_by_hand"]),
    e("grpo", "kl_coef", Support::All, "", &["kl_k3_by_hand"]),
    e("grpo", "tis", Support::All, "", &["tis_weights_by_hand"]),
    e("grpo", "entropy_coef", Support::All, "", &["clipped_loss_with_asymmetric_clip_by_hand"]),
    e("grpo", "std_norm", Support::All, "", &["grpo_advantages_by_hand"]),
    e("grpo", "aggregation", Support::All, "token (DAPO), sequence (GRPO), micro_token (BNPO), constant (Dr. GRPO)", &["loss_normalisations_by_hand"]),
    e("grpo", "mis", Support::All, "", &["mis_masks_tokens_outside_the_band_by_hand"]),
    e("grpo", "advantage", Support::All, "grpo, rloo, reinforce_pp", &["rloo_and_reinforce_pp_advantages_by_hand"]),
    e("grpo", "ratio", Support::All, "", &["gspo_sequence_ratio_by_hand"]),
    e("grpo", "epochs", Support::All, "", &["epochs_reshuffle_mini_batches_and_keep_old_logprobs"]),
    e("grpo", "overlong", Support::All, "", &["overlong_shaping_by_hand"]),
    e("grpo", "grad_clip", Support::All, "", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("grpo", "optimizer", Support::All, "", &["lr_schedules"]),
    e("grpo", "backend", Support::All, "the backend's own schema says where it runs", TRAINS),
    e("grpo", "lora", Support::Only(&[E, W], &["none"]), LORA_WHERE, LORA_TESTS),
    e("grpo", "opd", Support::Rule(rule_opd), "on-policy distillation: the teacher stage's per-token scores join the advantage", OPD_TESTS),
    e("ppo", "", Support::All, "PPO with a learned critic (a separate model with a value head) and GAE", PPO_TESTS),
    e("ppo", "rollout_batch", Support::All, "", PPO_TESTS),
    e("ppo", "global_batch", Support::All, "", PPO_TESTS),
    e("ppo", "steps_per_rollout", Support::All, "optimizer steps per rollout, for the policy and the critic alike", PPO_TESTS),
    e("ppo", "micro_batch", Support::All, "", PPO_TESTS),
    e("ppo", "lr", Support::All, "", &["lr_schedules"]),
    e("ppo", "critic_lr", Support::All, "the critic's own AdamW, on the policy's LR schedule", PPO_TESTS),
    e("ppo", "clip_low", Support::All, "", &["clipped_loss_with_asymmetric_clip_by_hand"]),
    e("ppo", "clip_high", Support::All, "", &["clipped_loss_with_asymmetric_clip_by_hand"]),
    e("ppo", "kl_coef", Support::All, "", &["kl_k3_by_hand"]),
    e("ppo", "tis", Support::All, "", &["tis_weights_by_hand"]),
    e("ppo", "mis", Support::All, "", &["mis_masks_tokens_outside_the_band_by_hand"]),
    e("ppo", "entropy_coef", Support::All, "", &["clipped_loss_with_asymmetric_clip_by_hand"]),
    e("ppo", "epochs", Support::All, "the policy and the critic pass over the batch alike", &["epochs_reshuffle_mini_batches_and_keep_old_logprobs"]),
    e("ppo", "rollout_logprobs", Support::All, "the sampler's log-probs as the behaviour policy", PPO_TESTS),
    e("ppo", "gamma", Support::All, "", &["gae_and_value_loss_by_hand"]),
    e("ppo", "lambda", Support::All, "", &["gae_and_value_loss_by_hand"]),
    e("ppo", "value_clip", Support::All, "", &["gae_and_value_loss_by_hand"]),
    e("ppo", "grad_clip", Support::All, "the policy's and the critic's gradients, each its own norm", PPO_TESTS),
    e("ppo", "optimizer", Support::All, "the policy's and the critic's AdamW settings", &["lr_schedules"]),
    e("ppo", "backend", Support::All, "the backend's own schema says where it runs", PPO_TESTS),
    e("ppo", "opd", Support::Rule(rule_opd), "the distillation term joins GAE's advantages", OPD_TESTS),
    e("ppo", "lora", Support::Refused(&["none"]), "LoRA with PPO's critic is not run yet: use `grpo` with `lora`, or full fine-tuning with `ppo`", &[]),
    e("weights", "", Support::All, "", &["remote_stages_generate_train_and_sync_weights_with_every_transport"]),
    e("weights", "transport", Support::Rule(rule_transport), "embedded: local; workers: broadcast, p2p, disk_delta; http: from disk", &["remote_stages_generate_train_and_sync_weights_with_every_transport"]),
    e("weights", "channel", Support::Only(&[W], &["auto"]), "the channel carries transfers between worker processes: in one process, or to servers loading from disk, remove `channel`", &["the_recipe_channel_is_parsed_and_forces_the_stream", "a_forced_shm_channel_refuses_an_engine_on_another_host", "nccl_channel_names_the_missing_library_or_broadcasts_between_two_gpus", "the_weight_channel_reaches_the_workers_and_nccl_names_what_is_missing"]),
    e("weights", "bucket", Support::Only(&[W], &[]), "buckets split transfers between processes: in one process, or to servers loading from disk, remove `bucket`", &["broadcast_tcp_to_three_engines"]),
    e("weights", "verify", Support::Only(&[W], &["true"]), "transfers between worker processes are always verified per bucket and tensor; in one process there is no transfer: remove `verify`", &["a_corrupted_weight_bucket_is_detected_and_not_loaded"]),
    e("weights", "verify_full", Support::Only(&[W], &["false"]), "the whole-weights SHA-256 applies to transfers between worker processes: remove `verify_full`", &["remote_stages_generate_train_and_sync_weights_with_every_transport"]),
    e("evaluate", "", Support::All, "", &["evaluation_modes_report_their_lag"]),
    e("evaluate", "prompts", Support::Rule(rule_eval_prompts), "the test split of the rollout's prompt set", &["run_trains_and_a_saved_plan_runs_exactly"]),
    e("evaluate", "every", Support::All, "", &["run_trains_and_a_saved_plan_runs_exactly"]),
    e("evaluate", "temperature", Support::Refused(&["0", "0.0"]), "evaluation decodes greedily: remove `temperature`", &[]),
    e("evaluate", "limit", Support::All, "", &["greedy_answers_match_the_batch_engine"]),
    e("evaluate", "mode", Support::Only(&[E], &["shared"]), "snapshot and external evaluation need a second copy of the weights in the `miles run` process: with a launcher or URL engine set `mode = shared` (the rollout engines evaluate)", &["evaluation_modes_report_their_lag"]),
    e("evaluate", "command", Support::Only(&[E], &["none"]), "external evaluation runs beside the in-process asynchronous schedules", &["external_output"]),
    e("checkpoint", "", Support::All, "", &["resume_after_clean_stop_equals_uninterrupted"]),
    e("checkpoint", "every", Support::All, "", &["resume_after_clean_stop_equals_uninterrupted"]),
    e("checkpoint", "keep", Support::All, "", &["resume_after_clean_stop_equals_uninterrupted"]),
    e("samples", "", Support::All, "OUT/samples.jsonl, shown by `miles report`", SAMPLES_TESTS),
    e("samples", "every", Support::All, "", &["samples_are_due_at_the_first_every_nth_and_last_step"]),
    e("samples", "count", Support::All, "", &["single_turn_rows_show_prompt_response_reward_and_the_dropped_one_first"]),
    // ---- std/prelude: clusters, schedules ----------------------------------------------------
    e("local", "", Support::All, "this machine", TRAINS),
    e("local", "cpus", Support::Describes, DESCRIBES, &[]),
    e("local", "device", Support::Rule(rule_device), "cpu, cuda (the machine's first GPU) or auto; a diffusion recipe computes on the CPU", &["cuda_is_refused_with_a_reason_where_the_machine_lacks_it", "a_cuda_recipe_on_a_machine_without_a_gpu_is_refused_before_training"]),
    e("local", "memory", Support::Describes, DESCRIBES, &[]),
    e("local", "memory_bandwidth", Support::Describes, DESCRIBES, &[]),
    e("local", "fp32", Support::Describes, DESCRIBES, &[]),
    e("gpu_cluster", "", Support::Refused(&[]), "a GPU cluster is planned, not run by `miles run`", &[]),
    e("gpu_cluster", "gpu", Support::Describes, DESCRIBES, &[]),
    e("gpu_cluster", "gpus", Support::Describes, DESCRIBES, &[]),
    e("gpu_cluster", "gpus_per_node", Support::Describes, DESCRIBES, &[]),
    e("sync", "", Support::All, "", TRAINS),
    e("sync", "filter", Support::Rule(rule_sync_filter), "DAPO's dynamic sampling: over-sample until the step's groups have signal", &["dynamic_sampling_over_samples_until_groups_have_signal"]),
    e("sync", "max_rounds", Support::All, "", &["dynamic_sampling_over_samples_until_groups_have_signal"]),
    e("one_step_off", "", Support::All, "", &["one_step_off_is_exactly_one_version_behind", "async_schedules_run_with_engine_workers"]),
    e("fully_async", "", Support::All, "", &["fully_async_tiny_run_trains_and_resumes", "async_schedules_run_with_engine_workers", "fully_async_with_miles_serve_as_the_engine_trains"]),
    e("fully_async", "max_staleness", Support::All, "", &["stale_groups_retry_or_discard"]),
    e("fully_async", "max_concurrent", Support::All, "", &["fully_async_runs_and_reports_its_metrics"]),
    e("fully_async", "refill", Support::Only(&[E], &["per_group"]), "engines in worker processes or behind a URL take whole groups per call (a slot is refilled when its call returns): set `refill = per_group`; per-sample refill runs in process", &["fully_async_runs_and_reports_its_metrics", "async_schedules_run_with_engine_workers"]),
    e("fully_async", "buffer_capacity", Support::All, "", &["a_full_buffer_blocks_generation"]),
    e("fully_async", "update_interval", Support::All, "", &["in_place_swaps_record_every_version_and_respect_staleness"]),
    e("fully_async", "pause", Support::All, "", &["retract_and_abort_pauses_drop_requests_in_flight"]),
    e("fully_async", "on_stale", Support::All, "", &["stale_groups_retry_or_discard"]),
    e("fully_async", "on_abort", Support::All, "", &["aborted_groups_retry_or_discard"]),
    e("fully_async", "starvation_retries", Support::All, "", &["starving_prompts_are_served_first_and_their_age_reported"]),
    e("fully_async", "filter", Support::All, "", &["filtered_groups_are_never_trained"]),
    e("fully_async", "staleness_gate", Support::All, "", &["the_staleness_gate_keeps_generation_from_running_ahead"]),
    e("fully_async", "stall_timeout", Support::All, "", &["a_stuck_trainer_or_engine_is_named_after_the_timeout"]),
    // ---- engines and backends ------------------------------------------------------------------
    e("embedded_engine", "", Support::Only(&[E, W], &[]), "the embedded engine runs in `miles run` or a worker", TRAINS),
    e("embedded_engine", "precision", Support::All, "bf16 samples with bf16 weights; the trainer computes in its own `precision`", &["bf16_engine_differs_from_fp32_trainer"]),
    e("embedded_engine", "threads", Support::Refused(&["2"]), "libtorch threads come from `miles run --threads N`: remove `threads`", &[]),
    e("sglang", "", Support::Only(&[H], &[]), "an SGLang-compatible server runs where its `url` points", &["serve_speaks_sglang_generate_weights_pause_and_counts_prefix_reuse"]),
    e("sglang", "url", Support::Only(&[H], &["none"]), "", &["serve_speaks_sglang_generate_weights_pause_and_counts_prefix_reuse"]),
    e("sglang", "gpus", Support::Refused(&["none"]), "a server given by URL is configured where it runs: remove it (it sizes engines miles launches on a GPU cluster)", &[]),
    e("sglang", "first_gpu", Support::Refused(&["none"]), "a server given by URL is configured where it runs", &[]),
    e("sglang", "tp", Support::Refused(&["1"]), "a server given by URL is configured where it runs", &[]),
    e("sglang", "ep", Support::Refused(&["1"]), "a server given by URL is configured where it runs", &[]),
    e("sglang", "precision", Support::Refused(&["bf16"]), "a server given by URL is configured where it runs", &[]),
    e("sglang", "mem_fraction", Support::Refused(&["0.85"]), "a server given by URL is configured where it runs", &[]),
    e("sglang", "max_concurrent", Support::Refused(&["128"]), "a server given by URL is configured where it runs", &[]),
    e("sglang", "prefix_cache_hit", Support::Describes, DESCRIBES, &[]),
    e("embedded_trainer", "", Support::All, "", TRAINS),
    e("embedded_trainer", "threads", Support::Refused(&["2"]), "libtorch threads come from `miles run --threads N`: remove `threads`", &[]),
    e("embedded_trainer", "precision", Support::All, "fp32, or bf16 GEMMs against fp32 weights (a stdlib check refuses the rest)", &["a_bf16_trainer_trains_in_bf16_in_process_and_in_a_worker_alike", "bf16_matmuls_follow_fp32_within_rounding_and_keep_fp32_weights_and_gradients"]),
    e("embedded_trainer", "dp", Support::Rule(rule_dp), "ranks > 1 are trainer worker processes (launcher = local_processes, slurm or ray) reducing over Gloo on the CPU; in one process, or beside servers given by URL, dp = 1", DP_TESTS),
    e("embedded_trainer", "zero", Support::Only(&[W], &["none"]), "ZeRO-1 shards the Adam moments over data-parallel ranks, which are worker processes: set a launcher and dp = 2 or more, or remove `zero`", ZERO_TESTS),
    e("embedded_trainer", "dp_bucket", Support::Rule(rule_dp_bucket), "gradient bytes per all-reduce bucket of the data-parallel ranks: worker processes with dp = 2 or more", DP_TESTS),
    e("embedded_trainer", "collective_timeout", Support::Rule(rule_collective_timeout), "the deadline of the data-parallel ranks' rendezvous and collectives: worker processes with dp = 2 or more", DP_FAULT_TESTS),
    e("megatron", "", Support::Refused(&[]), "Megatron-LM trains on GPU clusters: planned, not run here", &[]),
    e("megatron", "*", Support::Describes, DESCRIBES, &[]),
    e("fsdp", "", Support::Refused(&[]), "FSDP trains on GPU clusters: planned, not run here", &[]),
    e("fsdp", "*", Support::Describes, DESCRIBES, &[]),
    e("adam", "", Support::All, "", &["lr_schedules"]),
    e("adam", "beta1", Support::All, "", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("adam", "beta2", Support::All, "", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("adam", "eps", Support::All, "", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("adam", "weight_decay", Support::All, "", &["micro_batches_accumulate_to_the_full_batch_gradient"]),
    e("adam", "warmup", Support::All, "", &["lr_schedules"]),
    e("adam", "decay", Support::All, "", &["lr_schedules"]),
    e("adam", "state", Support::Refused(&["on_gpu"]), "optimizer-state offload is a GPU-cluster setting (the embedded trainer keeps it in memory): remove `state`", &[]),
    e("lora", "", Support::Only(&[E, W], &[]), LORA_WHERE, LORA_TESTS),
    e("lora", "adapters", Support::Rule(rule_lora_adapters), "several named adapters in `miles run`'s own process, `sync` schedule, single-turn prompts", MULTI_LORA_TESTS),
    e("lora", "init", Support::Only(&[E, W], &["none"]), "the adapter starts at a PEFT adapter's A and B, in `miles run`'s process or in workers", &["lora_init_continues_a_peft_adapter"]),
    e("lora", "named", Support::Rule(rule_lora_named), "named adapters (multi-LoRA) run in `miles run`'s own process, `sync` schedule, single-turn prompts", MULTI_LORA_TESTS),
    e("adapter", "", Support::All, "one adapter of a multi-LoRA run", MULTI_LORA_TESTS),
    e("adapter", "prompts", Support::Rule(rule_adapter_prompts), "built-in tasks, jsonl and parquet, train split", MULTI_LORA_TESTS),
    e("adapter", "partial_credit", Support::Rule(rule_adapter_partial_credit), "partial credit is `exact_match`'s scoring", MULTI_LORA_TESTS),
    e("adapter", "*", Support::All, "each adapter's name and learning rate", MULTI_LORA_TESTS),
    e("lora", "*", Support::All, "rank, alpha, dropout and target_modules shape the adapters", LORA_TESTS),
    e("mis", "", Support::All, "", &["mis_masks_tokens_outside_the_band_by_hand"]),
    e("overlong", "", Support::All, "", &["overlong_shaping_by_hand"]),
    e("mis", "*", Support::All, "the band of trainer/sampler ratios that keep their gradient", &["mis_masks_tokens_outside_the_band_by_hand"]),
    e("overlong", "*", Support::All, "the punishment interval, its end and its weight", &["overlong_shaping_by_hand"]),
    e("opd", "", Support::All, "", OPD_TESTS),
    e("opd", "teacher", Support::All, "the teacher stage whose scores join the advantage", OPD_TESTS),
    e("teacher_logprobs", "", Support::All, "the teacher scores each step's batch between the reward and the trainer", OPD_TESTS),
    e("teacher_logprobs", "process", Support::All, "the teacher in a worker process of its own (with a launcher: a `teacher` worker over gRPC)", &["a_teacher_in_its_own_process_distils_alike_and_survives_a_kill"]),
    e("teacher_logprobs", "gpus", Support::Refused(&["none"]), "a teacher on GPUs of its own is planned for GPU clusters; here it runs beside the trainer: remove `gpus`", &[]),
    e("opd", "*", Support::All, "the weights of the two advantage terms", &["opd_advantage_by_hand"]),
    e("compaction", "", Support::All, "", COMPACTION),
    e("compaction", "keep_turns", Support::All, "", COMPACTION),
    e("tito", "", Support::All, "`generate.session` says when a session is executed", EPISODES),
    e("tito", "rule", Support::All, "", &["pairs_are_the_contexts_the_episode_driver_shows", "a_compacted_episode_branches_into_a_new_chain"]),
    // ---- environments ---------------------------------------------------------------------------
    e("calculator", "", Support::All, "", EPISODES),
    e("calculator", "tool_reward", Support::All, "", &["an_episode_with_the_tool"]),
    e("calculator", "digits", Support::All, "", &["questions_from_data_rows"]),
    e("calculator", "demo_tool_rate", Support::All, "", &["demonstrations_call_the_tool_at_the_rate_asked"]),
    e("command_env", "", Support::All, "", PY_ENV),
    e("command_env", "command", Support::All, "", PY_ENV),
    e("command_env", "pass_env", Support::All, "", &["a_program_sees_pass_env_and_not_the_run_secrets"]),
    e("openenv", "", Support::All, "", &["episodes_against_a_real_openenv_server"]),
    e("openenv", "url", Support::All, "", &["episodes_against_a_real_openenv_server"]),
    e("openenv", "action_field", Support::All, "", &["episodes_against_a_real_openenv_server"]),
    e("openenv", "observation_field", Support::All, "", &["episodes_against_a_real_openenv_server"]),
    e("agent_program", "", Support::All, "", AGENT_LAYER_TESTS),
    e("agent_program", "command", Support::All, "", AGENT_LAYER_TESTS),
    e("agent_program", "pass_env", Support::All, "", &["a_program_sees_pass_env_and_not_the_run_secrets"]),
    e("rollout_program", "", Support::All, "", &["a_rollout_program_returns_one_reward_per_session"]),
    e("rollout_program", "command", Support::All, "", &["a_rollout_program_returns_one_reward_per_session"]),
    e("rollout_program", "pass_env", Support::All, "", &["a_program_sees_pass_env_and_not_the_run_secrets"]),
    e("external_agents", "", Support::All, "", &["external_sessions_are_handed_out_from_the_rows"]),
    e("external_agents", "bind", Support::All, "", &["external_sessions_are_handed_out_from_the_rows"]),
    e("verifiers", "", Support::All, "", VERIFIERS_RUN),
    e("verifiers", "module", Support::All, "", VERIFIERS_RUN),
    e("verifiers", "args", Support::Rule(rule_verifiers_args), "a JSON object", &["verifiers_args_that_are_not_an_object_are_refused_at_check", "verifiers_envs_drive_miles_run"]),
    e("verifiers", "python", Support::All, "", VERIFIERS),
    e("verifiers", "pass_env", Support::All, "", VERIFIERS),
    // ---- models and data ------------------------------------------------------------------------
    e("denoiser", "", Support::Only(&[E], &[]), DIFFUSION_WHERE, &["sample_is_seeded_and_rows_do_not_depend_on_their_batch"]),
    e("denoiser", "params", Support::Describes, DESCRIBES, &[]),
    e("denoiser", "*", Support::All, "", DIFFUSION_RUN),
    e("transformer", "", Support::All, "", TRAINS),
    e("transformer", "layers", Support::All, "", &["save_load_round_trips_bit_for_bit"]),
    e("transformer", "d_model", Support::All, "", &["save_load_round_trips_bit_for_bit"]),
    e("transformer", "heads", Support::All, "", &["save_load_round_trips_bit_for_bit"]),
    e("transformer", "kv_heads", Support::All, "", &["save_load_round_trips_bit_for_bit"]),
    e("transformer", "d_ff", Support::All, "", &["save_load_round_trips_bit_for_bit"]),
    e("transformer", "vocab", Support::All, "", &["clear_errors_before_training"]),
    e("transformer", "max_len", Support::All, "", &["clear_errors_before_training"]),
    e("transformer", "experts", Support::All, "", &["moe_router_picks_top_k_and_renormalises"]),
    e("transformer", "top_k", Support::All, "", &["moe_router_picks_top_k_and_renormalises"]),
    e("transformer", "expert_d_ff", Support::All, "", &["moe_layers_after_dense_layers"]),
    e("transformer", "shared_expert_d_ff", Support::Rule(rule_moe_shared_expert), "0: an MoE's final model exports as transformers' qwen3_moe or mixtral, neither of which has a shared expert", MOE_EXPORT),
    e("transformer", "dense_layers", Support::All, "", &["moe_layers_after_dense_layers"]),
    e("transformer", "gating", Support::Rule(rule_moe_gating), "softmax on an MoE: qwen3_moe and mixtral route by a softmax", MOE_EXPORT),
    e("transformer", "norm_topk", Support::All, "", &["moe_router_picks_top_k_and_renormalises"]),
    e("transformer", "aux_loss_coef", Support::All, "", &["aux_loss_balances_expert_load"]),
    e("transformer", "qk_norm", Support::Rule(rule_moe_qk_norm), "an MoE without q/k norms exports as mixtral: no dense layers, norm_topk = true", MOE_EXPORT),
    e("hf", "", Support::Only(&[E, W], &[]), HF_WHERE, BYO),
    e("hf", "path", Support::Only(&[E, W], &[]), HF_WHERE, BYO),
    e("hf", "repo", Support::Only(&[E, W], &[]), "resolved offline in the local Hugging Face cache by `miles check`; the run loads the snapshot directory", &["a_model_from_the_hub_cache_checks_plans_and_runs"]),
    e("hf", "revision", Support::Only(&[E, W], &[]), "a branch or tag read from the cache's refs/, or a commit", &["a_model_from_the_hub_cache_checks_plans_and_runs"]),
    e("hf", "config", Support::Only(&[E, W], &[]), "read from the directory; a run refuses a config.json changed since `miles check`", &["a_config_changed_after_check_is_refused"]),
    e("hf", "max_len", Support::Only(&[E, W], &[]), HF_WHERE, BYO),
    e("hf", "*", Support::Only(&[E, W], &[]), "read from config.json; set only to restate it", BYO),
    e("llm", "", Support::Refused(&[]), "catalog models are planned for GPU clusters; the embedded backend trains a `transformer { ... }`", &[]),
    e("llm", "*", Support::Describes, DESCRIBES, &[]),
    e("gpu", "*", Support::Describes, DESCRIBES, &[]),
    e("host", "*", Support::Describes, DESCRIBES, &[]),
    e("jsonl", "", Support::All, "", &["jsonl_task_runs_end_to_end"]),
    e("jsonl", "path", Support::All, "", &["jsonl_task_runs_end_to_end"]),
    e("jsonl", "prompt_field", Support::All, "", &["jsonl_task_runs_end_to_end"]),
    e("jsonl", "label_field", Support::All, "", &["jsonl_task_runs_end_to_end"]),
    e("jsonl", "on_error", Support::All, "", &["malformed_rows_name_file_and_line"]),
    e("jsonl", "split", Support::All, "train for rollout and SFT, test for evaluation (see those rules)", &["jsonl_task_runs_end_to_end"]),
    e("jsonl", "test_size", Support::All, "", &["jsonl_task_runs_end_to_end"]),
    e("jsonl", "split_seed", Support::All, "", &["jsonl_task_runs_end_to_end"]),
    e("jsonl", "split_by", Support::All, "", SPLIT_BY),
    e("jsonl", "split_key", Support::All, "", &["split_by_key_keeps_groups_whole"]),
    e("parquet", "", Support::All, "", BYO_PARQUET),
    e("parquet", "path", Support::All, "", BYO_PARQUET),
    e("parquet", "prompt_field", Support::All, "", &["strings_chats_and_passthrough_fields"]),
    e("parquet", "label_field", Support::All, "", &["strings_chats_and_passthrough_fields"]),
    e("parquet", "on_error", Support::All, "", &["malformed_rows_name_file_and_line"]),
    e("parquet", "split", Support::All, "train for rollout and SFT, test for evaluation (see those rules)", BYO_PARQUET),
    e("parquet", "test_size", Support::All, "", BYO_PARQUET),
    e("parquet", "split_seed", Support::All, "", BYO_PARQUET),
    e("parquet", "split_by", Support::All, "", SPLIT_BY),
    e("parquet", "split_key", Support::All, "", &["split_by_key_keeps_groups_whole"]),
    e("parquet", "held_out", Support::All, "", HELD_OUT),
    e("addition", "digits", Support::All, "", TASKS),
    e("addition", "split", Support::All, "", TASKS),
    e("addition", "test_size", Support::All, "", TASKS),
    e("addition", "split_seed", Support::All, "", TASKS),
    e("multiplication", "digits", Support::All, "", TASKS),
    e("multiplication", "split", Support::All, "", TASKS),
    e("multiplication", "test_size", Support::All, "", TASKS),
    e("multiplication", "split_seed", Support::All, "", TASKS),
    e("reverse", "min_len", Support::All, "", TASKS),
    e("reverse", "max_len", Support::All, "", TASKS),
    e("reverse", "alphabet", Support::All, "", TASKS),
    e("reverse", "split", Support::All, "", TASKS),
    e("reverse", "test_size", Support::All, "", TASKS),
    e("reverse", "split_seed", Support::All, "", TASKS),
    e("reverse", "working", Support::All, "", &["reverse_working_target_and_scoring"]),
    e("sort", "min_len", Support::All, "", TASKS),
    e("sort", "max_len", Support::All, "", TASKS),
    e("sort", "alphabet", Support::All, "", TASKS),
    e("sort", "split", Support::All, "", TASKS),
    e("sort", "test_size", Support::All, "", TASKS),
    e("sort", "split_seed", Support::All, "", TASKS),
    // ---- launchers ----------------------------------------------------------------------------
    e("in_process", "", Support::Only(&[E, H], &[]), "", TRAINS),
    e("local_processes", "", Support::Only(&[W], &[]), "", &["one_engine_in_worker_processes_learns_bit_identically_to_in_process"]),
    e("local_processes", "engines", Support::All, "", &["a_killed_rollout_engine_is_dropped_when_the_recipe_says_so"]),
    e("local_processes", "cpus_per_worker", Support::All, "", &["one_engine_in_worker_processes_learns_bit_identically_to_in_process"]),
    e("local_processes", "on_failure", Support::All, "", &["a_killed_rollout_engine_is_dropped_when_the_recipe_says_so"]),
    e("local_processes", "call_timeout", Support::All, "", &["a_silent_engine_hits_its_deadline_and_is_named"]),
    e("local_processes", "bind", Support::All, "", &["one_engine_in_worker_processes_learns_bit_identically_to_in_process"]),
    e("slurm", "", Support::Only(&[W], &[]), "", &["grpo_under_slurm_learns_as_in_process", "fully_async_under_slurm_trains_with_every_prompt_accounted_for"]),
    e("slurm", "partition", Support::All, "", &["sbatch_script_has_one_step_per_worker_with_gres"]),
    e("slurm", "time_limit", Support::All, "", &["sbatch_script_has_one_step_per_worker_with_gres"]),
    e("slurm", "engines", Support::All, "", &["grpo_under_slurm_learns_as_in_process"]),
    e("slurm", "gpus_per_engine", Support::All, "", &["sbatch_script_has_one_step_per_worker_with_gres"]),
    e("slurm", "gpus_per_trainer", Support::All, "", &["sbatch_script_has_one_step_per_worker_with_gres"]),
    e("slurm", "cpus_per_worker", Support::All, "", &["sbatch_script_has_one_step_per_worker_with_gres"]),
    e("slurm", "on_failure", Support::All, "", &["a_killed_rollout_engine_is_dropped_when_the_recipe_says_so"]),
    e("slurm", "call_timeout", Support::All, "", &["a_silent_engine_hits_its_deadline_and_is_named"]),
    e("slurm", "start_timeout", Support::All, "", &["grpo_under_slurm_learns_as_in_process"]),
    e("slurm", "bind", Support::All, "", &["grpo_under_slurm_learns_as_in_process"]),
    e("ray", "", Support::Only(&[W], &[]), "", &["ray_job_body", "grpo_under_ray_learns_as_in_process_and_runs_fully_async"]),
    e("ray", "address", Support::All, "", &["ray_job_body"]),
    e("ray", "engines", Support::All, "", &["ray_job_body"]),
    e("ray", "gpus_per_engine", Support::All, "", &["ray_job_body"]),
    e("ray", "gpus_per_trainer", Support::All, "", &["ray_job_body"]),
    e("ray", "on_failure", Support::All, "", &["a_killed_rollout_engine_is_dropped_when_the_recipe_says_so"]),
    e("ray", "call_timeout", Support::All, "", &["a_silent_engine_hits_its_deadline_and_is_named"]),
    e("ray", "start_timeout", Support::All, "", &["ray_job_body"]),
    e("ray", "bind", Support::All, "", &["ray_job_body"]),
    // ---- recipe settings ------------------------------------------------------------------------
    e("recipe_settings", "cluster", Support::All, "the cluster's own schema says where it runs", TRAINS),
    e("recipe_settings", "schedule", Support::All, "", &["fully_async_tiny_run_trains_and_resumes", "async_schedules_run_with_engine_workers"]),
    e("recipe_settings", "placement", Support::Refused(&["disaggregated"]), "placement chooses GPU pools for `miles plan`; on this machine rollout and training share the CPUs: remove `placement`", &[]),
    e("recipe_settings", "stop", Support::All, "", TRAINS),
    e("recipe_settings", "seed", Support::All, "", &["same_seed_gives_identical_metrics"]),
    e("recipe_settings", "launcher", Support::All, "the launcher's own schema says where it runs", &["one_engine_in_worker_processes_learns_bit_identically_to_in_process"]),
    e("recipe_settings", "runs_on", Support::All, "which target `miles check` holds the recipe to", &["runs_on_selects_the_target"]),
];
