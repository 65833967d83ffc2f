//! A scripted session with a real client: headless Neovim starts `miles-lsp` (the same server
//! as `miles lsp`), opens a recipe, receives diagnostics, asks for completion and hover. Skips,
//! saying why, where `nvim` is not installed (CI installs it: `apt-get install -y neovim`).

use std::process::Command;
use std::time::Duration;

const RECIPE: &str = r#"import std/tasks/arith

model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }

recipe tiny {
    rollout = generate(policy) {
        prompts        = arith.addition { digits = 2 }
        max_new_tokens = 4.tokens
    }
    reward = exact_match(rollout)
    train  = grpo(rollout, reward) {
        rollout_batch = 16
        global_batch  = 128
        lrr           = 3e-4

    }
    sync = weights(train -> rollout)
}
"#;

// Written for Neovim 0.7 (Debian 12) and later: `start_client` + `buf_attach_client`,
// arguments through the environment.
const SCRIPT: &str = r#"
local env = function(k) return os.getenv(k) end
local bin, path, out = env('MILES_BIN'), env('MILES_FILE'), env('MILES_OUT')
local cl, cc = tonumber(env('MILES_CL')), tonumber(env('MILES_CC'))
local hl, hc = tonumber(env('MILES_HL')), tonumber(env('MILES_HC'))
local result = { errors = {} }
local function finish()
  local f = io.open(out, 'w')
  f:write(vim.fn.json_encode(result))
  f:close()
  vim.cmd('qa!')
end
local ok, err = pcall(function()
  vim.cmd('edit ' .. vim.fn.fnameescape(path))
  local buf = vim.api.nvim_get_current_buf()
  local id = vim.lsp.start_client({ name = 'miles', cmd = { bin }, root_dir = vim.fn.fnamemodify(path, ':h') })
  if not id then error('start_client failed') end
  vim.lsp.buf_attach_client(buf, id)
  vim.wait(20000, function() return #vim.diagnostic.get(buf) > 0 end, 20)
  result.diagnostics = {}
  for _, d in ipairs(vim.diagnostic.get(buf)) do
    table.insert(result.diagnostics, { line = d.lnum, col = d.col, code = d.code, message = d.message })
  end
  local td = { uri = vim.uri_from_bufnr(buf) }
  local resp = vim.lsp.buf_request_sync(buf, 'textDocument/completion', { textDocument = td, position = { line = cl, character = cc } }, 20000)
  result.completion = {}
  for _, r in pairs(resp or {}) do
    local items = r.result and (r.result.items or r.result) or {}
    for _, it in ipairs(items) do table.insert(result.completion, it.label) end
  end
  local hov = vim.lsp.buf_request_sync(buf, 'textDocument/hover', { textDocument = td, position = { line = hl, character = hc } }, 20000)
  for _, r in pairs(hov or {}) do
    if r.result and r.result.contents then result.hover = r.result.contents.value end
  end
end)
if not ok then table.insert(result.errors, tostring(err)) end
finish()
"#;

fn position(text: &str, at: usize) -> (usize, usize) {
    let line = text[..at].matches('\n').count();
    let col = at - text[..at].rfind('\n').map(|i| i + 1).unwrap_or(0);
    (line, col)
}

#[test]
fn neovim_session() {
    let version = Command::new("nvim").arg("--version").output();
    let Ok(v) = version else {
        println!("skipping the Neovim session: `nvim` is not installed (apt-get install -y neovim)");
        return;
    };
    let first = String::from_utf8_lossy(&v.stdout).lines().next().unwrap_or("").to_string();
    let dir = std::env::temp_dir().join(format!("miles-nvim-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let recipe = dir.join("tiny.miles");
    let script = dir.join("session.lua");
    let out = dir.join("out.json");
    std::fs::write(&recipe, RECIPE).expect("write recipe");
    std::fs::write(&script, SCRIPT).expect("write script");
    // Completion on the empty line of the train block, hover on `grpo`.
    let (cl, cc) = position(RECIPE, RECIPE.find("3e-4\n\n").expect("blank line") + "3e-4\n".len());
    let (hl, hc) = position(RECIPE, RECIPE.find("grpo(").expect("grpo") + 2);
    let mut child = Command::new("nvim")
        .args(["--headless", "--clean", "-u", "NONE", "-c"])
        .arg(format!("luafile {}", script.display()))
        .env("MILES_BIN", env!("CARGO_BIN_EXE_miles-lsp"))
        .env("MILES_FILE", &recipe)
        .env("MILES_OUT", &out)
        .env("MILES_CL", cl.to_string())
        .env("MILES_CC", (cc + 8).to_string())
        .env("MILES_HL", hl.to_string())
        .env("MILES_HC", hc.to_string())
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .spawn()
        .expect("start nvim");
    // Bounded: the script's own waits end within ~80 s; kill it past 120 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                panic!("{first}: the session did not finish in 120 s");
            }
        }
    }
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap_or_default()).unwrap_or(serde_json::Value::Null);
    assert_eq!(result["errors"].as_array().map(|e| e.len()), Some(0), "{first}: {result}");
    let diags = result["diagnostics"].as_array().cloned().unwrap_or_default();
    assert!(diags.iter().any(|d| d["code"] == "E0105" && d["line"] == 13), "{first}: diagnostics {diags:?}");
    let labels: Vec<&str> =
        result["completion"].as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect()).unwrap_or_default();
    assert!(labels.contains(&"micro_batch") && !labels.contains(&"rollout_batch"), "{first}: completion {labels:?}");
    let hover = result["hover"].as_str().unwrap_or("");
    assert!(hover.contains("stage grpo(rollout: Trajectories, reward: Scores) -> Policy"), "{first}: hover {hover}");
    println!("{first}: diagnostics, completion and hover over stdio: ok");
    let _ = std::fs::remove_dir_all(&dir);
}
