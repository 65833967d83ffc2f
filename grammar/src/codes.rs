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

pub const CODES: &[Code] = &[
    // ---- E00xx: syntax -------------------------------------------------------------------
    Code {
        code: "E0001",
        title: "syntax error",
        explanation: "The parser could not read this part of the file. It skips to the next line, \
field or item and carries on, so every other mistake in the file is still reported.\n\n\
The message says what was expected at the first character that could not be read.",
    },
    Code {
        code: "E0002",
        title: "unclosed delimiter",
        explanation: "A `{`, `(` or `[` has no matching closing delimiter before the next item \
starts (or the file ends). The parser closes it there and goes on.",
    },
    Code {
        code: "E0003",
        title: "nesting too deep",
        explanation: "Brackets nest deeper than the parser allows (256 levels), or one expression \
nests deeper than 1000 levels (parentheses, lists, records, calls, `if`, a thousand `-` or \
`.field` in a row). A chain of binary operators is not nesting: `1 + 1 + ... + 1` may be as long \
as the file. Real recipes never come near these limits; they keep the checker from exhausting \
its stack on hostile input. Split the expression into named constants.",
    },
    Code {
        code: "E0004",
        title: "file is not valid UTF-8",
        explanation: "`.miles` files must be UTF-8. Invalid bytes are replaced by U+FFFD so the \
rest of the file can still be checked.",
    },
    Code {
        code: "E0005",
        title: "invalid number literal",
        explanation: "A number could not be read, or it does not fit: integers and the exact \
rationals that hold every number are 128-bit. Example: `99999999999999999999999999999999999999999`.",
    },
    Code {
        code: "E0006",
        title: "file too large",
        explanation: "Source files are limited to 8 MiB. Split a generated library into modules.",
    },
    // ---- E01xx: modules and names -------------------------------------------------------------
    Code {
        code: "E0101",
        title: "module not found",
        explanation: "An `import` names a module that does not exist. `std/...` paths name the \
embedded standard library; `./x` and `../x` are relative to the importing file (the `.miles` \
extension is implied).",
    },
    Code {
        code: "E0102",
        title: "import cycle",
        explanation: "Modules import each other in a cycle. The message lists the cycle's path. \
Move the shared declarations into a module both can import.",
    },
    Code {
        code: "E0103",
        title: "unknown name",
        explanation: "A name is used that no declaration, import or binding in scope defines. \
When a similar name exists, the help line suggests it.",
    },
    Code {
        code: "E0104",
        title: "duplicate definition",
        explanation: "Two declarations in one module, two fields in one block or two bindings in \
one recipe have the same name. The second is reported; the first is kept.",
    },
    Code {
        code: "E0105",
        title: "unknown field",
        explanation: "A block sets a field that its schema or stage kind does not declare. The \
help line lists the closest declared field.",
    },
    Code {
        code: "E0106",
        title: "missing required field",
        explanation: "A schema or stage field without a default (and not optional) is not set.",
    },
    Code {
        code: "E0107",
        title: "not a module member",
        explanation: "`module.name` names something the module does not declare.",
    },
    Code {
        code: "E0108",
        title: "unknown recipe to extend",
        explanation: "`recipe x extends y` names no recipe `y` in scope.",
    },
    Code {
        code: "E0109",
        title: "unknown enum member",
        explanation: "A value is given for an enum-typed field that is not one of the enum's \
members. The help line lists them.",
    },
    Code {
        code: "E0110",
        title: "import escapes the package root",
        explanation: "In a package (a directory with a `miles.toml`), a relative import may not \
leave the package's directory: `import ../../other/x` would make the package depend on files that \
are not part of it, so it would not build anywhere else. Declare the other package under \
`[dependencies]` and import it by name (`import other/x`), or move the module into the package \
(docs/packages.md).",
    },
    Code {
        code: "E0111",
        title: "package is not a declared dependency",
        explanation: "`import NAME/...` names a package of the build that the importing module's \
own package does not declare in its `[dependencies]`. A package may import only what its manifest \
declares, so it builds the same way inside any project. Add the dependency (`miles add NAME \
--git URL --tag vX` or `--path DIR`).",
    },
    Code {
        code: "E0112",
        title: "invalid manifest or lock file",
        explanation: "`miles.toml` (or `miles.lock`) could not be read: a TOML syntax error, an \
unknown key, a name that is not a package name, a version that is not semantic (`1.2.0`), a \
requirement that does not parse (`^1.0`), or a dependency that gives both or neither of `path` \
and `git`. The label points at the line. A broken lock file can be deleted: `miles update` writes \
it again.",
    },
    Code {
        code: "E0113",
        title: "dependency cycle",
        explanation: "Packages depend on each other in a circle (the message shows it, `a -> b -> \
a`). Move what both need into a third package that both depend on.",
    },
    Code {
        code: "E0114",
        title: "repository unreachable or fetch failed",
        explanation: "A dependency's repository could not be cloned or fetched (wrong URL, no \
network, no access), or its files could not be exported into the cache. Nothing half-written is \
left in the cache: every entry is written under a temporary name and renamed when complete. \
Once a revision is cached, builds work offline; `miles vendor` copies dependencies into the \
project for machines with no access at all.",
    },
    Code {
        code: "E0115",
        title: "no such tag or version",
        explanation: "The repository has no tag, branch or revision of that name, or no tag \
(`v1.2.0` or `1.2.0`) satisfies the version requirement. The help lists the tags it has.",
    },
    Code {
        code: "E0116",
        title: "dependency contents changed",
        explanation: "The files of a locked dependency do not hash to what `miles.lock` recorded: \
the cached copy was edited, or the tag was moved upstream to other contents. The message names \
the package, the expected and the found hash. Delete the cached directory to fetch it again; if \
the new contents are wanted, `miles update NAME` records them.",
    },
    Code {
        code: "E0117",
        title: "two packages with the same name",
        explanation: "One build holds one package per name, since the name is the first segment \
of its imports. Two dependencies name the same package from different repositories or \
directories, or a dependency is declared under a name other than its manifest's. The message \
shows which package asked for each.",
    },
    Code {
        code: "E0118",
        title: "two versions of one package",
        explanation: "Two packages of the build require versions of one package that no single \
tag satisfies (`^1.1` and `=1.0.0`), or pin it to different tags, branches or revisions. The \
message shows the chain of packages that asked for each; loosen one requirement or update the \
package that asks for the older version.",
    },
    Code {
        code: "E0119",
        title: "library test failed",
        explanation: "`miles test` compiled a recipe named in a `[[test]]` table of `miles.toml` \
and the result was not the expected one: it was to pass and failed, or to fail with a given \
check (a rule name, a code, or words of its message) and passed or failed otherwise.",
    },
    // ---- E02xx: types, units and evaluation ---------------------------------------------------
    Code {
        code: "E0201",
        title: "type mismatch",
        explanation: "A value of one type is given where another is expected, for example a \
String for an Int field or a record of the wrong schema.",
    },
    Code {
        code: "E0202",
        title: "unit mismatch",
        explanation: "Quantities of different dimensions are combined or assigned: bytes where a \
duration is expected, `1.GB + 2.s`, or a plain number where a quantity is required. Write the \
unit: `512.MB`, `30.s`, `200.steps`, `8k.tokens`, `900.GB/s`.",
    },
    Code {
        code: "E0203",
        title: "unknown unit",
        explanation: "A quantity literal uses a unit miles does not know. Units: B KB MB GB TB \
KiB MiB GiB TiB; ms s min h; steps; tokens; B/s KB/s MB/s GB/s TB/s GiB/s; FLOP/s GFLOP/s \
TFLOP/s PFLOP/s.",
    },
    Code {
        code: "E0204",
        title: "value out of range",
        explanation: "A value is outside the range its field declares, e.g. `temperature: Float \
in 0..=2`.",
    },
    Code {
        code: "E0205",
        title: "arithmetic error",
        explanation: "Compile-time arithmetic overflowed 128 bits, divided by zero, or applied an \
operator to values that do not support it.",
    },
    Code {
        code: "E0206",
        title: "recursive definition",
        explanation: "A constant or binding refers to itself, directly or through others. \
Evaluation always terminates, so such cycles are rejected with their path.",
    },
    Code {
        code: "E0207",
        title: "wrong number of arguments",
        explanation: "A stage kind or builtin function is called with more or fewer arguments \
than it declares.",
    },
    Code {
        code: "E0208",
        title: "not callable",
        explanation: "Only stage kinds and builtin functions can be called with `(...)`.",
    },
    Code {
        code: "E0209",
        title: "invalid override",
        explanation: "`--set key=value` or an amended field in `extends` names a path that does \
not exist in the recipe, or the value does not parse.",
    },
    Code {
        code: "E0210",
        title: "cannot read a file the recipe names",
        explanation: "A recipe names a file that `miles check` reads, and it cannot be read or \
does not say what it must: a Hugging Face model directory's config.json (`hf { path = ... }`) that \
is missing, not JSON, of an architecture the embedded backend does not load (Llama, Mistral, \
Qwen2, Qwen3), or without a size the model needs. The message names the file and the key; paths \
are relative to the directory `miles` runs in.",
    },
    // ---- E03xx: checks and the stage graph ---------------------------------------------------
    Code {
        code: "E0301",
        title: "check failed",
        explanation: "A `check` rule evaluated to false. Checks live in the standard library and \
in your own modules; the diagnostic names the rule and where it is defined, and shows the \
values of the fields it relates.",
    },
    Code {
        code: "E0309",
        title: "rule warning",
        explanation: "A `warn` rule evaluated to false. Like a `check`, but the recipe is still \
valid: the rule points at something likely to cost time or memory (uneven pipeline stages, a \
TP group spanning NVLink domains). `--deny-warnings` turns it into a failure.",
    },
    Code {
        code: "E0302",
        title: "check is not a boolean",
        explanation: "A `check` expression must evaluate to true or false.",
    },
    Code {
        code: "E0303",
        title: "stage graph cycle",
        explanation: "Stages consume each other's outputs in a cycle. Only weight-sync edges \
(`weights(train -> rollout)`) may point backwards. The message lists the cycle's path.",
    },
    Code {
        code: "E0304",
        title: "trained rollout without weight sync",
        explanation: "A train stage updates the policy a rollout generates with, but no \
`weights(train -> rollout)` stage sends the new weights back, so the rollout would keep \
sampling from the initial policy. Add `sync = weights(train -> rollout)`.",
    },
    Code {
        code: "E0305",
        title: "unused stage",
        explanation: "A stage's output is consumed by no other stage. This is a warning: it \
still runs, but probably a reference is missing.",
    },
    Code {
        code: "E0306",
        title: "wrong port type",
        explanation: "A stage's input port receives a value of the wrong channel type: e.g. a \
reward stage where trajectories are expected. Ports: Prompts, Trajectories, Scores, TokenScores, Policy, \
Metrics.",
    },
    Code { code: "E0307", title: "recipe has no stages", explanation: "A recipe must instantiate at least one stage." },
    Code {
        code: "E0308",
        title: "no recipe",
        explanation: "The command needs a recipe but the file declares none, or several without \
`--recipe NAME` to pick one.",
    },
    // ---- E04xx: planning ------------------------------------------------------------------
    Code {
        code: "E0401",
        title: "does not fit in GPU memory",
        explanation: "`miles plan` adds up what one training rank holds (weights, FP32 gradients, \
optimizer state at 12 bytes per parameter as the layout shards it, activations) and it exceeds \
the usable share of the GPU's HBM. The message says by how much; the help line lists fixes with \
the memory each leaves: `optimizer_offload = stream_from_disk` or `cpu` (with its cost per \
step), more data-parallel GPUs, full recomputation, or another pipeline split. docs/plan.md \
gives every formula.",
    },
    Code {
        code: "E0402",
        title: "rollout engine does not fit",
        explanation: "An inference engine's weights leave no room for the KV cache within \
`mem_fraction` of HBM, or the KV cache cannot hold one sequence of prompt + response tokens. \
Use more GPUs per engine (larger TP), a smaller weight or KV precision, or shorter sequences.",
    },
    Code {
        code: "E0403",
        title: "not enough GPUs",
        explanation: "The stages ask for more GPUs than the cluster has, for GPU ids outside it, \
for ranges that overlap in a disaggregated placement, or for GPUs on a CPU-only cluster. The \
message says how many are left.",
    },
    Code {
        code: "E0404",
        title: "invalid parallel layout",
        explanation: "A parallel size is 0, an engine's DP or EP does not divide its TP, EP does \
not divide the expert count or TP x CP x DP, or TP x PP x CP x DP differs from the stage's GPU \
count. The planner reports the layout instead of guessing one.",
    },
    Code {
        code: "E0405",
        title: "batch figures do not add up",
        explanation: "`rollout_batch x samples_per_prompt` must equal `global_batch x \
steps_per_rollout`: every sample generated in a rollout step is trained on exactly once. The \
planner derives a missing figure from the other three when it divides evenly.",
    },
    Code {
        code: "E0406",
        title: "tensor parallelism spans NVLink domains",
        explanation: "A warning: a TP group is larger than (or does not divide) the GPU's \
NVLink / xGMI domain, so its all-reduces cross the slower scale-out network. Keep TP within a \
domain and use PP, EP or more engines for the rest.",
    },
    Code {
        code: "E0407",
        title: "KV cache holds fewer sequences than requested",
        explanation: "A warning: an engine is asked for more concurrent requests than its KV \
cache can hold at the recipe's prompt + response length; the rest wait or are retracted. The \
plan's throughput uses the number that fits.",
    },
    Code {
        code: "E0408",
        title: "host memory too small",
        explanation: "A warning: optimizer state offloaded to the CPU needs more host memory per \
node than the node has. Stream it from disk instead, or shard it over more GPUs.",
    },
    Code {
        code: "E0409",
        title: "stage cannot be planned",
        explanation: "A stage that runs an engine or a trainer has no model, so its memory and \
time cannot be planned: give it a model from `std/models` or an `llm { ... }` record. Or a trainer \
on the embedded backend (the CPU trainer of `local` clusters) sits in a recipe on GPUs, where it \
would train in fp32 on the host: set `backend = fsdp { gpus = ... }` or `megatron { ... }`.",
    },
    Code {
        code: "E0410",
        title: "stage kind not planned",
        explanation: "A warning: a stage runs a model but its kind is none the planner knows (a \
stage kind declared in the recipe's own modules, such as a teacher), so the plan gives it no \
GPUs, no memory and no time. Plan its GPUs yourself, or run the model behind a reward service.",
    },
    Code {
        code: "E0411",
        title: "bf16 on a CPU without bf16 instructions",
        explanation: "A warning from `miles plan` and `miles run` on this machine: an embedded trainer or \
engine computes in bf16 (`precision = bf16`), and this CPU has neither AVX512-BF16 nor AMX. \
libtorch then emulates bf16 GEMMs, which run slower than fp32 ones, so bf16 only costs \
accuracy here. Set `precision = fp32`, or run on a CPU with bf16 instructions (docs/precision.md).",
    },
    // ---- E05xx: running and data ----------------------------------------------------------
    Code {
        code: "E0501",
        title: "task data file not found",
        explanation: "A task reads prompts from a JSONL file that does not exist or cannot be \
read. Paths are relative to the directory the run was started from. Check the `path` (and \
`test_path`) of the task.",
    },
    Code {
        code: "E0502",
        title: "malformed data line",
        explanation: "A line of a JSONL prompt file is not a JSON object, or its prompt or label \
field is missing or not a string. The message gives file:line. With `on_error: skip` the line is \
skipped with a warning; with `on_error: stop` the run stops before training.",
    },
    Code {
        code: "E0503",
        title: "vocabulary does not cover the tokenizer",
        explanation: "The model's `vocab_size` is smaller than the task tokenizer's vocabulary, \
so some token ids would have no embedding row. Raise `vocab_size` to at least the number the \
message gives. This is checked before any training starts.",
    },
    Code {
        code: "E0504",
        title: "invalid run spec",
        explanation: "A field of the run spec is out of range or inconsistent with another: e.g. \
`rollout_batch * samples_per_prompt` not a multiple of `global_batch`, or `d_model` not a \
multiple of `n_heads`. The message names the field.",
    },
    Code {
        code: "E0505",
        title: "loss is not finite",
        explanation: "A loss or gradient norm became NaN or infinite, so the run stopped rather \
than write broken weights. The last good checkpoint is kept; lower the learning rate, enable \
`grad_clip`, or set a TIS cap, then resume or restart.",
    },
    Code {
        code: "E0506",
        title: "checkpoint error",
        explanation: "A checkpoint could not be written or read, or `--resume` found no complete \
checkpoint in the output directory. Checkpoints are written to a temporary directory and renamed, \
so a crash never leaves a half-written one that looks complete.",
    },
    Code {
        code: "E0507",
        title: "output directory cannot be used",
        explanation: "The output directory already holds a run (and `--resume` was not given), \
belongs to a run with a different spec, or cannot be created or written.",
    },
    Code {
        code: "E0508",
        title: "backend error",
        explanation: "The compute backend (libtorch for the embedded backend) reported an error: \
a shape mismatch, an allocation failure, or a missing library. The message carries the backend's \
own text.",
    },
    Code {
        code: "E0509",
        title: "timed out",
        explanation: "A bounded wait expired: the run's wall-time limit, or a wait on a worker, \
transfer or file lock. Every wait in a run has a limit so a stuck component stops the run with \
this error instead of hanging.",
    },
    Code {
        code: "E0510",
        title: "sequence longer than the model allows",
        explanation: "A prompt plus `max_new_tokens` (or a prompt plus its gold answer, for the \
SFT warm-up) is longer than the model's `max_len`. Raise `max_len` or shorten the prompts.",
    },
    Code {
        code: "E0511",
        title: "a field the recipe's backend does not execute",
        explanation: "A recipe is a promise: every field it sets is executed by the backend it \
runs on, or refused before anything starts. `miles check` holds each recipe to its target (its \
`runs_on` setting, or what its stages imply: the embedded backend in `miles run`, worker \
processes with a launcher, rollout servers given by URL) and reports every field that target does \
not execute, with its line and what to do instead; docs/capabilities.md lists them field by field. \
A recipe naming GPU engines or trainers (sglang without `url`, megatron, fsdp) targets a GPU \
cluster: `miles check` and `miles plan` accept it and `miles run` refuses it with this code.",
    },
    Code {
        code: "E0512",
        title: "saved plan does not match the recipe",
        explanation: "`miles run --plan plan.json` executes exactly what was planned. A source file \
of the recipe changed after `miles plan --out` wrote the plan (its hash differs), or the plan \
file is from another version of miles. Plan again.",
    },
    Code {
        code: "E0513",
        title: "a worker died, stopped answering or could not be reached",
        explanation: "A stage of a distributed run (`launcher = local_processes`, `slurm` or `ray`) runs \
as a `miles worker` process. The message names the stage, the worker, its host and pid. A worker \
whose process exited, whose connection broke, which sent no heartbeat for the heartbeat timeout, \
or which did not answer a call within its deadline (`call_timeout`) is treated as dead. With \
`on_failure = drop_engine` a lost rollout engine is dropped and its groups are regenerated on the \
others; otherwise (and always for the trainer) the run stops, keeping its checkpoints: \
`miles run --resume` continues. Each worker's log is in OUT/workers/<id>.log.",
    },
    Code {
        code: "E0514",
        title: "a weight transfer failed verification",
        explanation: "Weights travel from the trainer to the rollout engines in buckets with a CRC-32 \
each, per-tensor CRC-32s of the result and, with `verify_full = true`, a SHA-256 of the whole \
weights. A mismatch means the bytes were corrupted in transit or on disk; that version is not \
loaded and the engine keeps its previous weights. Also raised when a version did not arrive in \
time or a disk-delta chain is broken.",
    },
    Code {
        code: "E0515",
        title: "a call without the run's token was refused",
        explanation: "Every worker-protocol call and weight stream carries the run's token (made by \
the controller, passed to workers in MILES_RUN_TOKEN). A worker refuses anything else, so a \
stray client or another run on the same machine cannot drive or feed it.",
    },
    Code {
        code: "E0516",
        title: "a launcher could not start the workers",
        explanation: "`sbatch`, `scontrol`, the Ray Jobs API or a local process could not be started \
or refused the job. The message carries the launcher's own error; check that Slurm (or Ray) is \
installed and reachable, and the partition and GPU counts of the recipe's `launcher`.",
    },
    Code {
        code: "E0517",
        title: "a reward failed",
        explanation: "A reward stage (a command reward program, an HTTP reward service or a \
verifier) crashed, exited, or answered something malformed (a wrong id or count, a non-number, \
NaN), and its `on_error` is `stop`. The message names the stage, the sample and what it returned \
(the program's last stderr lines for a command). A reward that times out stops with E0509 \
instead. `on_error = drop` leaves the sample out, `zero` scores it 0; both are counted in the \
`reward/dropped` and `reward/zeroed` metrics, never silent (docs/rewards.md).",
    },
    Code {
        code: "E0518",
        title: "the machine lacks the GPUs or CUDA libraries the recipe needs",
        explanation: "The recipe's `local` cluster says `device = cuda`, or asks for more GPUs than \
the machine has, and this machine cannot give them: no NVIDIA driver (libcuda.so), no GPU visible \
(CUDA_VISIBLE_DEVICES), fewer GPUs than asked (the message gives both numbers), or libtorch's CUDA \
library (libtorch_cuda.so) missing or of another version than the one miles was built against \
(the message names the library and the expected version). `miles plan` reports it before \
anything starts; `miles run` stops with it before training. `device = auto` falls back to the CPU \
instead, and says why. docs/gpu.md describes the GPU path.",
    },
];
