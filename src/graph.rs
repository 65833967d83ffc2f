//! `miles graph FILE --format mermaid|dot|json`: the lowered stage graph of a recipe.

use crate::diagnostics::{emit, summary};
use crate::files::DiskFs;
use crate::DiagFormat;
use miles_compiler::Options;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum GraphFormat {
    Mermaid,
    Dot,
    Json,
}

#[derive(clap::Args)]
pub struct Args {
    pub file: String,
    /// Which recipe, when the file has several.
    #[arg(long)]
    pub recipe: Option<String>,
    #[arg(long, value_enum, default_value = "mermaid")]
    pub format: GraphFormat,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

pub fn run(args: Args) -> u8 {
    let overrides = match crate::check::sets_or_exit(&args.set) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let c = crate::packages::compile(
        &DiskFs,
        std::slice::from_ref(&args.file),
        &Options { overrides, recipe: args.recipe.clone(), hub_cache: crate::packages::hub_cache() },
    );
    let (errors, _) = summary(&c.diagnostics);
    if errors > 0 {
        emit(&c.program.sources, &c.diagnostics, DiagFormat::Auto);
        return 1;
    }
    let recipe = match pick_recipe(&c, &args.file) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match args.format {
        GraphFormat::Mermaid => print!("{}", recipe.graph.to_mermaid()),
        GraphFormat::Dot => print!("{}", recipe.graph.to_dot()),
        GraphFormat::Json => {
            let mut j = recipe.graph.to_json();
            j["format_version"] = serde_json::json!(1);
            j["recipe"] = serde_json::json!(recipe.name);
            println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default())
        }
    }
    0
}

/// The one recipe a command works on: the only one compiled, or an error naming the choices.
pub fn pick_recipe<'c>(
    c: &'c miles_compiler::Compilation,
    file: &str,
) -> Result<&'c miles_compiler::CompiledRecipe, u8> {
    match c.recipes.as_slice() {
        [one] => Ok(one),
        [] => {
            eprintln!("error[E0308]: {file} declares no recipe");
            Err(1)
        }
        many => {
            let names: Vec<&str> = many.iter().map(|r| r.name.as_str()).collect();
            eprintln!(
                "error[E0308]: {file} declares several recipes ({}); pick one with --recipe NAME",
                names.join(", ")
            );
            Err(1)
        }
    }
}
