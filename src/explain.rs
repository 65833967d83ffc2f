//! `miles explain CODE`: the long explanation of an error code.

use miles_grammar::codes::{lookup, CODES};

#[derive(clap::Args)]
pub struct Args {
    /// An error code such as E0301; omit to list every code.
    pub code: Option<String>,
}

pub fn run(args: Args) -> u8 {
    match args.code {
        None => {
            for c in CODES {
                println!("{}  {}", c.code, c.title);
            }
            0
        }
        Some(code) => match lookup(&code) {
            Some(c) => {
                println!("{}: {}\n\n{}", c.code, c.title, c.explanation);
                0
            }
            None => {
                eprintln!("error: no error code `{code}`; `miles explain` lists them all");
                1
            }
        },
    }
}
