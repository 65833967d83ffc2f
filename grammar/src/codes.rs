//! The error-code registry: every code any crate emits is listed here, with a title and a long
//! explanation (`miles explain CODE`). docs/errors.md is generated from this table and a test
//! keeps them equal. Ranges: E00xx syntax, E01xx modules and names, E02xx types, units and
//! evaluation, E03xx checks and the stage graph, E04xx planning, E05xx running and data.

pub struct Code {
    pub code: &'static str,
    pub title: &'static str,
    pub explanation: &'static str,
}

pub fn lookup(code: &str) -> Option<&'static Code> {
    let wanted = code.trim().to_ascii_uppercase();
    CODES.iter().find(|c| c.code == wanted)
}

/// Declares the registry: the `ErrorCode` enum (one variant per code, so a diagnostic can only
/// carry a registered code) and `CODES`, the table `miles explain` and docs/errors.md read.
macro_rules! registry {
    ($($id:ident: $title:expr, $explanation:expr;)*) => {
        /// A registered error code (`ErrorCode::E0511`); written as its name (`"E0511"`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ErrorCode {
            $($id,)*
        }

        impl ErrorCode {
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$id => stringify!($id),)*
                }
            }
        }

        pub const CODES: &[Code] = &[
            $(Code { code: stringify!($id), title: $title, explanation: $explanation },)*
        ];
    };
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::ops::Deref for ErrorCode {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<str> for ErrorCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

registry! {
    // ---- E00xx: syntax -------------------------------------------------------------------
    E0001: "syntax error",
        "The parser could not read this part of the file. It skips to the next line, \
field or item and carries on, so every other mistake in the file is still reported.\n\n\
The message says what was expected at the first character that could not be read.";
    E0002: "unclosed delimiter",
        "A `{`, `(` or `[` has no matching closing delimiter before the next item \
starts (or the file ends). The parser closes it there and goes on.";
    E0003: "nesting too deep",
        "Brackets nest deeper than the parser allows (256 levels), or one expression \
nests deeper than 1000 levels (parentheses, lists, records, calls, `if`, a thousand `-` or \
`.field` in a row). A chain of binary operators is not nesting: `1 + 1 + ... + 1` may be as long \
as the file. Real recipes never come near these limits; they keep the checker from exhausting \
its stack on hostile input. Split the expression into named constants.";
    E0004: "file is not valid UTF-8",
        "`.miles` files must be UTF-8. Invalid bytes are replaced by U+FFFD so the \
rest of the file can still be checked.";
    E0005: "invalid number literal",
        "A number could not be read, or it does not fit: integers and the exact \
rationals that hold every number are 128-bit. Example: `99999999999999999999999999999999999999999`.";
    E0006: "file too large",
        "Source files are limited to 8 MiB. Split a generated library into modules.";
    // ---- E01xx: modules and names -------------------------------------------------------------
    E0101: "module not found",
        "An `import` names a module that does not exist. `std/...` paths name the \
embedded standard library; `./x` and `../x` are relative to the importing file (the `.miles` \
extension is implied).";
    E0102: "import cycle",
        "Modules import each other in a cycle. The message lists the cycle's path. \
Move the shared declarations into a module both can import.";
    E0103: "unknown name",
        "A name is used that no declaration, import or binding in scope defines. \
When a similar name exists, the help line suggests it.";
    E0104: "duplicate definition",
        "Two declarations in one module, two fields in one block or two bindings in \
one recipe have the same name. The second is reported; the first is kept.";
    E0105: "unknown field",
        "A block sets a field that its schema or stage kind does not declare. The \
help line lists the closest declared field. When the name is TRL's, verl's, OpenRLHF's or \
slime's for one of ours (TRL's epsilon_high, loss_type and num_iterations, verl's ppo_epochs), the help \
says which field of miles means it, and how its value is written (docs/language.md, \
\"Names from other frameworks\").";
    E0106: "missing required field",
        "A schema or stage field without a default (and not optional) is not set.";
    E0107: "not a module member",
        "`module.name` names something the module does not declare.";
    E0108: "unknown recipe to extend",
        "`recipe x extends y` names no recipe `y` in scope.";
    E0109: "unknown enum member",
        "A value is given for an enum-typed field that is not one of the enum's \
members. The help line lists them.";
    E0110: "import escapes the package root",
        "In a package (a directory with a `miles.toml`), a relative import may not \
leave the package's directory: `import ../../other/x` would make the package depend on files that \
are not part of it, so it would not build anywhere else. Declare the other package under \
`[dependencies]` and import it by name (`import other/x`), or move the module into the package \
(docs/packages.md). A package import may not hold `..` (`import platform/../secret` would leave \
the dependency's root), and no import in a package may be an absolute path.";
    E0111: "package is not a declared dependency",
        "`import NAME/...` names a package of the build that the importing module's \
own package does not declare in its `[dependencies]`. A package may import only what its manifest \
declares, so it builds the same way inside any project. Add the dependency (`miles add NAME \
--git URL --tag vX` or `--path DIR`).";
    E0112: "invalid manifest or lock file",
        "`miles.toml` (or `miles.lock`) could not be read: a TOML syntax error, an \
unknown key, a name that is not a package name, a version that is not semantic (`1.2.0`), a \
requirement that does not parse (`^1.0`), or a dependency that gives both or neither of `path` \
and `git`. The label points at the line. A broken lock file can be deleted: `miles update` writes \
it again.";
    E0113: "dependency cycle",
        "Packages depend on each other in a circle (the message shows it, `a -> b -> \
a`). Move what both need into a third package that both depend on.";
    E0114: "repository unreachable or fetch failed",
        "A dependency's repository could not be cloned or fetched (wrong URL, no \
network, no access), or its files could not be exported into the cache. Nothing half-written is \
left in the cache: every entry is written under a temporary name and renamed when complete. \
Once a revision is cached, builds work offline; `miles vendor` copies dependencies into the \
project for machines with no access at all.";
    E0115: "no such tag or version",
        "The repository has no tag, branch or revision of that name, or no tag \
(`v1.2.0` or `1.2.0`) satisfies the version requirement. The help lists the tags it has.";
    E0116: "dependency contents changed",
        "The files of a locked dependency do not hash to what `miles.lock` recorded: \
the cached copy was edited, or the tag was moved upstream to other contents. The message names \
the package, the expected and the found hash. Delete the cached directory to fetch it again; if \
the new contents are wanted, `miles update NAME` records them.";
    E0117: "two packages with the same name",
        "One build holds one package per name, since the name is the first segment \
of its imports. Two dependencies name the same package from different repositories or \
directories, or a dependency is declared under a name other than its manifest's. The message \
shows which package asked for each.";
    E0118: "two versions of one package",
        "Two packages of the build require versions of one package that no single \
tag satisfies (`^1.1` and `=1.0.0`), or pin it to different tags, branches or revisions. The \
message shows the chain of packages that asked for each; loosen one requirement or update the \
package that asks for the older version.";
    E0119: "library test failed",
        "`miles test` compiled a recipe named in a `[[test]]` table of `miles.toml` \
and the result was not the expected one: it was to pass and failed, or to fail with a given \
check (a rule name, a code, or words of its message) and passed or failed otherwise.";
    E0120: "lock entry not backed by its sources",
        "An entry of `miles.lock` cannot be trusted: a git package without a content \
`hash`, a commit that the entry's tag, branch or revision does not name in the repository (for a \
branch: a commit not on it), or a version other than its tag's. A build checks the lock against \
the repositories and the files rather than believing it, so a change to `miles.lock` alone cannot \
make a build use other code. The label points at the entry in `miles.lock`. If the lock was \
edited, restore it; if a tag moved upstream, review the new contents, then `miles update NAME`.";
    E0121: "git URL not allowed",
        "A dependency's `git` URL (in `miles.toml`, `miles.lock` or `miles add --git`) is \
not one of the allowed forms: `https://`, `ssh://`, scp-like `[user@]host:path`, `file://` or an \
absolute path. git reads an argument starting with `-` as an option (`--upload-pack=...` runs a \
command) and a `TRANSPORT::address` URL through a helper that can run commands (`ext::sh -c \
...`); `http://` and `git://` are refused because nothing authenticates what they return. For a \
directory beside the project, declare a path dependency.";
    E0122: "symbolic link in a package",
        "A git dependency's files (in the cache or in `vendor/`) hold a symbolic link. The \
content hash in `miles.lock` covers the files of the tree, not what a link points at, so a link \
could make an import read files the lock does not pin, even outside the package. Replace the link \
by the file in the package's repository. Path dependencies are your own directories and are read \
as they are.";
    // ---- E02xx: types, units and evaluation ---------------------------------------------------
    E0201: "type mismatch",
        "A value of one type is given where another is expected, for example a \
String for an Int field or a record of the wrong schema.";
    E0202: "unit mismatch",
        "Quantities of different dimensions are combined or assigned: bytes where a \
duration is expected, `1.GB + 2.s`, or a plain number where a quantity is required. Write the \
unit: `512.MB`, `30.s`, `200.steps`, `8k.tokens`, `900.GB/s`.";
    E0203: "unknown unit",
        "A quantity literal uses a unit miles does not know. Units: B KB MB GB TB \
KiB MiB GiB TiB; ms s min h; steps; tokens; B/s KB/s MB/s GB/s TB/s GiB/s; FLOP/s GFLOP/s \
TFLOP/s PFLOP/s.";
    E0204: "value out of range",
        "A value is outside the range its field declares, e.g. `temperature: Float \
in 0..=2`.";
    E0205: "arithmetic error",
        "Compile-time arithmetic overflowed 128 bits, divided by zero, or applied an \
operator to values that do not support it.";
    E0206: "recursive definition",
        "A constant or binding refers to itself, directly or through others. \
Evaluation always terminates, so such cycles are rejected with their path.";
    E0207: "wrong number of arguments",
        "A stage kind or builtin function is called with more or fewer arguments \
than it declares.";
    E0208: "not callable",
        "Only stage kinds and builtin functions can be called with `(...)`.";
    E0209: "invalid override",
        "`--set key=value` or an amended field in `extends` names a path that does \
not exist in the recipe, or the value does not parse.";
    E0210: "cannot read a file the recipe names",
        "A recipe names a file that `miles check` reads, and it cannot be read or \
does not say what it must: a Hugging Face model directory's config.json (`hf { path = ... }`) that \
is missing, not JSON, of an architecture the embedded backend does not load (Llama, Mistral, \
Qwen2, Qwen3), or without a size the model needs. The message names the file and the key; paths \
are relative to the directory `miles` runs in.";
    E0215: "model not in the local Hugging Face cache",
        "`hf { repo = \"Qwen/Qwen3-0.6B\", revision = \"main\" }` names a model in the local Hugging Face \
Hub cache, and it is not there, or not whole. miles never downloads: it looks where huggingface_hub \
puts models (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else \
`~/.cache/huggingface/hub`), in `models--ORG--NAME/`, reads a branch or tag from `refs/REVISION` and \
uses `snapshots/COMMIT/`. The message says where it looked: the repository's folder is missing, the \
revision is neither a ref nor a snapshot, or a file of the snapshot is a link into `blobs/` whose blob \
is missing (an interrupted download). Download the model while online (`hf download ORG/NAME \
--revision REV`, or `huggingface-cli download ...`), then run offline; or set `path` to a model \
directory instead.";
    E0216: "PEFT adapter cannot be used",
        "`lora { init = \"adapters/math\" }` starts from a PEFT LoRA adapter directory, and `miles check` \
reads its adapter_config.json and the header of its adapter_model.safetensors (no tensor data). The \
message names the file and the key or tensor: the directory or a file is missing, the adapter is not \
plain LoRA (DoRA, rsLoRA, trained biases, modules_to_save, per-module ranks), a target module is not \
a linear layer miles wraps, a tensor's shape does not have the file's rank, or the tensors do not fit \
the model (another number of layers, or another width: an adapter made for another base model). A \
rank, alpha or target modules that differ from the recipe's are check failures (E0301) of std/prelude's \
`lora`.";
    // ---- E03xx: checks and the stage graph ---------------------------------------------------
    E0301: "check failed",
        "A `check` rule evaluated to false. Checks live in the standard library and \
in your own modules; the diagnostic names the rule and where it is defined, and shows the \
values of the fields it relates. A rule that names the field it blames (`at tp`) points where the \
recipe set that field, and its help proposes the values that would pass (`choose tp among 1, 2, 4, 8`).";
    E0309: "rule warning",
        "A `warn` rule evaluated to false. Like a `check`, but the recipe is still \
valid: the rule points at something likely to cost time or memory (uneven pipeline stages, a \
TP group spanning NVLink domains). `--deny-warnings` turns it into a failure.";
    E0302: "check is not a boolean",
        "A `check` expression must evaluate to true or false.";
    E0303: "stage graph cycle",
        "Stages consume each other's outputs in a cycle. Only weight-sync edges \
(`weights(train -> rollout)`) may point backwards. The message lists the cycle's path.";
    E0304: "trained rollout without weight sync",
        "A train stage updates the policy a rollout generates with, but no \
`weights(train -> rollout)` stage sends the new weights back, so the rollout would keep \
sampling from the initial policy. Add `sync = weights(train -> rollout)`.";
    E0305: "unused stage",
        "A stage's output is consumed by no other stage. This is a warning: it \
still runs, but probably a reference is missing.";
    E0306: "wrong port type",
        "A stage's input port receives a value of the wrong channel type: e.g. a \
reward stage where trajectories are expected. Ports: Prompts, Trajectories, Scores, TokenScores, Policy, \
Metrics.";
    E0307: "recipe has no stages",
        "A recipe must instantiate at least one stage.";
    E0308: "no recipe",
        "The command needs a recipe but the file declares none, or several without \
`--recipe NAME` to pick one.";
    E0310: "a program may not be given this environment variable",
        "A `command_reward` or `command_env` lists in `pass_env` a name that is not an environment \
variable's (letters, digits and `_`, not starting with a digit) or one of the run's own variables \
(`MILES_*`: `MILES_API_KEY` and the run token `MILES_RUN_TOKEN` among them). A program the run \
starts gets a cleared environment: PATH, HOME, USER, LOGNAME, LANG, LC_*, TZ, TMPDIR, TERM, \
PYTHONPATH and VIRTUAL_ENV, plus the names its `pass_env` lists; the run's secrets are never among \
them, so a verifier running model-written code cannot read them. Remove the name, or pass what the \
program needs under a name of its own (docs/rewards.md).";
    E0311: "a combination's parts score different rollouts",
        "A `combine` stage weighs the scores of its `parts` for each sample of its own rollout, so \
every part must be a reward stage of that rollout. A part that scores another rollout's samples \
scores responses the trainer never sees beside these. Give every stage named in `parts` the \
rollout the `combine` stage scores, as in recipes/grpo-combined-rewards.miles (docs/rewards.md, \
\"Combining rewards\").";
    // ---- E04xx: planning ------------------------------------------------------------------
    E0401: "does not fit in GPU memory",
        "`miles plan` adds up what one training rank holds (weights, FP32 gradients, \
optimizer state at 12 bytes per parameter as the layout shards it, activations) and it exceeds \
the usable share of the GPU's HBM. The message says by how much; the help line lists fixes with \
the memory each leaves: the trainer's optimizer state streamed from disk or kept on the CPU \
(`optimizer = adam { state = stream_from_disk }`, or `state = cpu`; each with its cost per step), \
more data-parallel GPUs, full recomputation, or another pipeline split. docs/plan.md \
gives every formula.";
    E0402: "rollout engine does not fit",
        "An inference engine's weights leave no room for the KV cache within \
`mem_fraction` of HBM, or the KV cache cannot hold one sequence of prompt + response tokens. \
Use more GPUs per engine (larger TP), a smaller weight or KV precision, or shorter sequences.";
    E0403: "not enough GPUs",
        "The stages ask for more GPUs than the cluster has, for GPU ids outside it, \
for ranges that overlap in a disaggregated placement, or for GPUs on a CPU-only cluster. The \
message says how many are left.";
    E0404: "invalid parallel layout",
        "A parallel size is 0, an engine's DP or EP does not divide its TP, EP does \
not divide the expert count or TP x CP x DP, or TP x PP x CP x DP differs from the stage's GPU \
count. The planner reports the layout instead of guessing one.";
    E0405: "batch figures do not add up",
        "`rollout_batch x samples_per_prompt` must equal `global_batch x \
steps_per_rollout`: every sample generated in a rollout step is trained on exactly once. The \
planner derives a missing figure from the other three when it divides evenly.";
    E0406: "tensor parallelism spans NVLink domains",
        "A warning: a TP group is larger than (or does not divide) the GPU's \
NVLink / xGMI domain, so its all-reduces cross the slower scale-out network. Keep TP within a \
domain and use PP, EP or more engines for the rest.";
    E0407: "KV cache holds fewer sequences than requested",
        "A warning: an engine is asked for more concurrent requests than its KV \
cache can hold at the recipe's prompt + response length; the rest wait or are retracted. The \
plan's throughput uses the number that fits.";
    E0408: "host memory too small",
        "A warning: optimizer state offloaded to the CPU needs more host memory per \
node than the node has. Stream it from disk instead, or shard it over more GPUs.";
    E0409: "stage cannot be planned",
        "A stage that runs an engine or a trainer has no model, so its memory and \
time cannot be planned: give it a model from `std/models` or an `llm { ... }` record. Or a trainer \
on the embedded backend (the CPU trainer of `local` clusters) sits in a recipe on GPUs, where it \
would train in fp32 on the host: set `backend = fsdp { gpus = ... }` or `megatron { ... }`.";
    E0410: "stage kind not planned",
        "A warning: a stage runs a model but its kind is none the planner knows (a \
stage kind declared in the recipe's own modules, such as a teacher), so the plan gives it no \
GPUs, no memory and no time. Plan its GPUs yourself, or run the model behind a reward service.";
    E0411: "bf16 on a CPU without bf16 instructions",
        "A warning from `miles plan` and `miles run` on this machine: an embedded trainer or \
engine computes in bf16 (`precision = bf16`), and this CPU has neither AVX512-BF16 nor AMX. \
libtorch then emulates bf16 GEMMs, which run slower than fp32 ones, so bf16 only costs \
accuracy here. Set `precision = fp32`, or run on a CPU with bf16 instructions (docs/precision.md).";
    E0412: "rollout throttled below its KV cache",
        "A note from `miles plan`: the step waits for the rollout, and the rollout's \
engines decode fewer sequences than their KV caches hold because the recipe holds them back: \
fully_async's `max_concurrent` (samples in flight across the fleet, spread over the engines), \
the engine's own `max_concurrent`, or a rollout batch smaller than the engines' slots (sync, \
one_step_off). Decoding is bound by reading the weights, so a fuller batch costs little more per \
step and yields more tokens. The note names the binding setting and the value to set, priced by \
planning the recipe again with it: enough to fill the KV slots, or less where more would not \
shorten the step (training, or a compute-bound decode, then sets it). Under fully_async more \
samples in flight also means more of them span a weight update (max_staleness still bounds \
what trains); a larger rollout batch trains in more optimizer steps per rollout \
(docs/plan.md, \"A throttled rollout\").";
    // ---- E05xx: running and data ----------------------------------------------------------
    E0501: "task data file not found",
        "A task reads prompts from a JSONL file that does not exist or cannot be \
read. Paths are relative to the directory the run was started from. Check the `path` of the \
`jsonl` or `parquet` prompt set.";
    E0502: "malformed data line",
        "A line of a JSONL prompt file is not a JSON object, or its prompt or label \
field is missing or not a string. The message gives file:line. With `on_error = skip` the line is \
skipped with a warning; with `on_error = stop` (the default) the run stops before training.";
    E0503: "vocabulary does not cover the tokenizer",
        "The model's `vocab` is smaller than the task tokenizer's vocabulary, \
so some token ids would have no embedding row. Raise `vocab` to at least the number the \
message gives. This is checked before any training starts.";
    E0504: "invalid run spec",
        "A field of the run spec is out of range or inconsistent with another: e.g. \
`rollout_batch * samples_per_prompt` not a multiple of `global_batch`, or `d_model` not a \
multiple of the model's `heads`. The message names the run spec's field.";
    E0505: "loss is not finite",
        "A loss or gradient norm became NaN or infinite, so the run stopped rather \
than write broken weights. The last good checkpoint is kept; lower the learning rate, enable \
`grad_clip`, or set a TIS cap, then resume or restart.";
    E0506: "checkpoint error",
        "A checkpoint could not be written or read, or `--resume` found no usable \
checkpoint in the output directory (the message names each and why). Checkpoints are written to a \
temporary directory, synced and renamed, so a crash never leaves a half-written one that looks \
complete; each holds `manifest.json` with every file's SHA-256, and a resume passes over one whose \
files do not match it for the one before, saying so (docs/runs.md).";
    E0507: "output directory cannot be used",
        "The output directory already holds a run (and `--resume` was not given), \
belongs to a run with a different spec, or cannot be created or written. A refused `--resume` names \
each run spec field that differs, saved value then new one (`train.lr: 0.001 -> 0.002`); a resume \
may change only `steps` (`stop` or `--steps`), `checkpoint.every`, `checkpoint.keep`, `eval.every`, `samples`, \
the stages' names and the trainer's data-parallel ranks (`train.dp`: `dp`, `zero`, `dp_bucket`, \
`collective_timeout`), and not to fewer steps than its checkpoint has done (docs/runs.md).";
    E0508: "backend error",
        "The compute backend (libtorch for the embedded backend) reported an error: \
a shape mismatch, an allocation failure, or a missing library. The message carries the backend's \
own text.";
    E0509: "timed out",
        "A bounded wait expired: the run's wall-time limit, or a wait on a worker, \
transfer or file lock. Every wait in a run has a limit so a stuck component stops the run with \
this error instead of hanging. A run of episodes stops with it too when every episode of a step \
(under an asynchronous schedule, of `rollout_batch` groups in a row) ended by an environment \
fault and was dropped: the step's metrics row, written first, counts them, and the console's \
warning line quotes why (docs/agents.md, When episodes fault).";
    E0510: "sequence longer than the model allows",
        "A prompt is longer than the rollout's `max_prompt_tokens`, or a prompt plus \
`max_new_tokens` (a prompt plus its gold answer, for the SFT warm-up) is longer than the model's \
`max_len`. `miles check` already refuses a recipe whose `max_prompt_tokens + max_new_tokens` \
exceeds `max_len` (a check of `std/stages.generate`; by default `max_prompt_tokens` is what \
`max_len` leaves after `max_new_tokens`); the run finds the prompts that are longer than the \
recipe says, before training. In a run of episodes `max_prompt_tokens` bounds each episode's \
first prompt as sent instead (a chat row's messages and the reset observation, as the env_reward \
stage's `prompt` says), checked when the episode starts. Raise `max_prompt_tokens` (and `max_len` \
with it), or shorten the prompts.";
    E0511: "a field the recipe's backend does not execute",
        "A recipe is a promise: every field it sets is executed by the backend it \
runs on, or refused before anything starts. `miles check` holds each recipe to its target (its \
`runs_on` setting, or what its stages imply: the embedded backend in `miles run`, worker \
processes with a launcher, rollout servers given by URL) and reports every field that target does \
not execute, with its line and what to do instead; docs/capabilities.md lists them field by field. \
A recipe naming GPU engines or trainers (sglang without `url`, megatron, fsdp) targets a GPU \
cluster: `miles check` and `miles plan` accept it and `miles run` refuses it with this code. The \
recipe's shape is held to what a run executes when `miles run` maps it (one `generate` rollout and \
one trainer, the stage kinds, engines, models and prompt sets the embedded backend reads; \
engine/compiler/src/capability/shape.rs): each refusal names the stage or field and its line.";
    E0512: "saved plan does not match the recipe",
        "`miles run --plan plan.json` executes exactly what was planned. It compiles the \
recipe again (the file, `--set` overrides and recipe `miles plan --out` used) and compares a \
fingerprint of what it means, the planner's input and the run spec: a comment or a reformatting \
changes nothing, any other change (a value, a default the stdlib now gives) does, and so does a \
recipe that no longer compiles. A plan file made before fingerprints compares its sources' \
bytes; one from another version of miles is refused too. Plan again.";
    E0513: "a worker died, stopped answering or could not be reached",
        "A stage of a distributed run (`launcher = local_processes`, `slurm` or `ray`) runs \
as a `miles worker` process. The message names the stage, the worker, its host and pid. A worker \
whose process exited, whose connection broke, which sent no heartbeat for the heartbeat timeout, \
or which did not answer a call within its deadline (`call_timeout`) is treated as dead. With \
`on_failure = drop_engine` a lost rollout engine is dropped and its groups are regenerated on the \
others; otherwise (and always for the trainer) the run stops, keeping its checkpoints: \
`miles run --resume` continues. Each worker's log is in OUT/workers/<id>.log.";
    E0514: "a weight transfer failed verification",
        "Weights travel from the trainer to the rollout engines in buckets with a CRC-32 \
each, per-tensor CRC-32s of the result and, with `verify_full = true`, a SHA-256 of the whole \
weights. A mismatch means the bytes were corrupted in transit or on disk; that version is not \
loaded and the engine keeps its previous weights. Also raised when a version did not arrive in \
time or a disk-delta chain is broken.";
    E0515: "a call without the run's token was refused",
        "Every worker-protocol call and weight stream carries the run's token (made by \
the controller, passed to workers in MILES_RUN_TOKEN). A worker refuses anything else, so a \
stray client or another run on the same machine cannot drive or feed it.";
    E0516: "a launcher could not start the workers",
        "`sbatch`, `scontrol`, the Ray Jobs API or a local process could not be started \
or refused the job. The message carries the launcher's own error; check that Slurm (or Ray) is \
installed and reachable, and the partition and GPU counts of the recipe's `launcher`.";
    E0517: "a reward failed",
        "A reward stage (a command reward program, an HTTP reward service or a \
verifier) crashed, exited, or answered something malformed (a wrong id or count, a non-number, \
NaN), and its `on_error` is `stop`. The message names the stage, the sample and what it returned \
(the program's last stderr lines for a command). A reward that times out stops with E0509 \
instead. `on_error = drop` leaves the sample out, `zero` scores it 0; both are counted in the \
`reward/dropped` and `reward/zeroed` metrics, never silent (docs/rewards.md).";
    E0518: "the machine lacks the GPUs or CUDA libraries the recipe needs",
        "The recipe's `local` cluster says `device = cuda`, or asks for more GPUs than \
the machine has, and this machine cannot give them: no NVIDIA driver (libcuda.so), no GPU visible \
(CUDA_VISIBLE_DEVICES), fewer GPUs than asked (the message gives both numbers), or libtorch's CUDA \
library (libtorch_cuda.so) missing or of another version than the one miles was built against \
(the message names the library and the expected version). `miles plan` reports it before \
anything starts; `miles run` stops with it before training. `device = auto` falls back to the CPU \
instead, and says why. docs/gpu.md describes the GPU path.";
    E0519: "a value that is built but has never run",
        "A warning from `miles check`: the recipe sets a value whose code is built and \
whose tests ran only on machines without the hardware it needs (their refusal half), so it has \
never run for real: `local { device = cuda }` (the embedded backend on a GPU) and \
`weights(train -> rollout) { channel = nccl }` (NCCL between GPUs). docs/capabilities.md marks them \
\"built, never run\". The recipe is valid and `miles run` tries it; expect the first run to meet \
what those tests could not. The mark goes when a run on that hardware is recorded in \
bench/RESULTS.md. `--deny-warnings` turns it into a failure.";
}
