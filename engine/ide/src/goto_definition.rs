//! Go to definition: the declaration of the name under the cursor; for an import path, the
//! module's file.

use crate::analysis::Analysis;
use crate::defs::DefKind;
use miles_grammar::ast::ItemKind;
use miles_grammar::diag::{FileId, Span};

/// Where the name under the cursor is declared. For an import path: the module's file.
pub fn definition(a: &Analysis, file: FileId, offset: usize) -> Option<Span> {
    if let Some(target) = import_at(a, file, offset) {
        return Some(Span::new(target, 0, 0));
    }
    let (_, def) = a.resolve(file, offset)?;
    if def.kind == DefKind::Module {
        // A module's name goes to the module, not to the import that binds it.
        if let Some(target) = import_at(a, def.span.file, def.span.start as usize) {
            return Some(Span::new(target, 0, 0));
        }
    }
    Some(def.span)
}

/// The file an import path under the cursor names.
pub(crate) fn import_at(a: &Analysis, file: FileId, offset: usize) -> Option<FileId> {
    let m = a.module_of_file(file)?;
    let module = a.program().module(m);
    for item in &module.ast.items {
        if let ItemKind::Import(imp) = &item.kind {
            if imp.path_span.contains(offset) {
                let key = a.program().import_key(&module.key, &imp.path)?;
                return a.file_id(&key);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::fixture::{at_cursor, loc, recipe, text_of};
    use insta::assert_snapshot;

    fn check(fixture: &str) -> String {
        let (a, file, offset) = at_cursor(fixture);
        match super::definition(&a, file, offset) {
            Some(span) => format!("{} `{}`", loc(&a, span), text_of(&a, span)),
            None => "(none)".into(),
        }
    }

    #[test]
    fn across_modules_and_into_the_stdlib() {
        let cases = [
            ("stdlib stage kind", recipe("").replace("train  = grpo(", "train  = gr$0po(")),
            ("stdlib field in a stage block", recipe("").replace("global_batch  = 128", "global_b$0atch  = 128")),
            ("imported constant", recipe("").replace("common.peak_lr", "common.pea$0k_lr")),
            ("import path", recipe("").replace("import ./lib/common", "import ./lib/com$0mon")),
            ("stage instance", recipe("").replace("weights(train -> rollout)", "weights(train -> roll$0out)")),
            ("model", recipe("").replace("generate(policy)", "generate(pol$0icy)")),
            ("recipe setting", recipe("").replace("stop = 100.steps", "st$0op = 100.steps")),
        ];
        let out: String = cases.iter().map(|(name, fx)| format!("{name}: {}\n", check(fx))).collect();
        assert_snapshot!(out, @r"
        stdlib stage kind: std/stages `grpo`
        stdlib field in a stage block: std/stages `global_batch`
        imported constant: lib/common.miles:2:7-2:14 `peak_lr`
        import path: lib/common.miles:1:1-1:1 ``
        stage instance: main.miles:8:5-8:12 `rollout`
        model: main.miles:5:7-5:13 `policy`
        recipe setting: std/prelude `stop`
        ");
    }

    /// A package import: its path and its names lead into the dependency's files.
    #[test]
    fn into_a_package_dependency() {
        let deps = crate::fixture::packages(&["grpo/base"]);
        let lib = "//- deps/platform/grpo/base.miles\n/// The fleet's rate.\nconst lr = 1e-4\n";
        let show = |main: &str| {
            let (a, file, offset) = crate::fixture::at_cursor_in(&format!("//- team/main.miles\n{main}{lib}"), &deps);
            match super::definition(&a, file, offset) {
                Some(span) => format!("{} `{}`", loc(&a, span), text_of(&a, span)),
                None => "(none)".into(),
            }
        };
        assert_eq!(show("import platform/grpo/ba$0se\n"), "deps/platform/grpo/base.miles:1:1-1:1 ``");
        assert_eq!(
            show("import platform/grpo/base { lr }\nconst x = l$0r * 2\n"),
            "deps/platform/grpo/base.miles:2:7-2:9 `lr`"
        );
    }
}
