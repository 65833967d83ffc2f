//! Prints the diagnostics (and with `--tree`, the tree) of parsing one file: a debugging aid.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: parse_file FILE [--tree]");
        std::process::exit(2);
    };
    let bytes = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let (tree, diags) = miles_grammar::parse(miles_grammar::diag::FileId(0), &text);
    if args.iter().any(|a| a == "--tree") {
        println!("{tree:#?}");
    }
    println!("{} items", tree.items.len());
    for d in diags {
        let at = d.primary.as_ref().map(|l| l.span.start as usize).unwrap_or(0);
        let line = text[..at.min(text.len())].matches('\n').count() + 1;
        println!("{}:{} {} {}", line, at, d.code, d.message);
    }
}
