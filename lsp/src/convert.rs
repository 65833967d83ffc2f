//! Byte offsets <-> LSP positions (UTF-16 code units, the protocol's default), and applying
//! incremental edits.

use lsp_types::{Position, Range};

/// Line starts of a text, for offset <-> position conversion.
pub struct LineIndex<'t> {
    text: &'t str,
    starts: Vec<usize>,
}

impl<'t> LineIndex<'t> {
    pub fn new(text: &'t str) -> LineIndex<'t> {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { text, starts }
    }

    pub fn position(&self, offset: usize) -> Position {
        let offset = floor_char_boundary(self.text, offset.min(self.text.len()));
        let line = self.starts.partition_point(|&s| s <= offset).saturating_sub(1);
        let col: usize = self.text[self.starts[line]..offset].chars().map(char::len_utf16).sum();
        Position { line: line as u32, character: col as u32 }
    }

    pub fn range(&self, start: usize, end: usize) -> Range {
        Range { start: self.position(start), end: self.position(end.max(start)) }
    }

    /// The byte offset of a position; past the end of a line is the line's end, past the last
    /// line is the end of the text (clients may send either).
    pub fn offset(&self, p: Position) -> usize {
        let Some(&start) = self.starts.get(p.line as usize) else { return self.text.len() };
        let end = self.starts.get(p.line as usize + 1).map(|e| e - 1).unwrap_or(self.text.len());
        let mut units = 0usize;
        for (i, c) in self.text[start..end].char_indices() {
            if units >= p.character as usize {
                return start + i;
            }
            units += c.len_utf16();
        }
        end
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Applies one `didChange` content change: a range edit, or the whole text when no range.
pub fn apply_change(text: &mut String, range: Option<Range>, new_text: &str) {
    match range {
        None => *text = new_text.to_string(),
        Some(r) => {
            let (start, end) = {
                let idx = LineIndex::new(text);
                (idx.offset(r.start), idx.offset(r.end))
            };
            let (start, end) = (start.min(end), end.max(start));
            text.replace_range(start..end, new_text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_round_trip() {
        let t = "a€b\n𝄞x\n";
        let idx = LineIndex::new(t);
        for off in [0, 1, 4, 5, 6, 10, 11, 12] {
            assert_eq!(idx.offset(idx.position(off)), off, "offset {off}");
        }
        assert_eq!(idx.position(10), Position { line: 1, character: 2 });
        assert_eq!(idx.offset(Position { line: 9, character: 0 }), t.len());
        assert_eq!(idx.offset(Position { line: 0, character: 99 }), 5);
    }

    #[test]
    fn applies_edits() {
        let mut t = "hello\nworld\n".to_string();
        apply_change(&mut t, Some(Range::new(Position::new(1, 0), Position::new(1, 5))), "there");
        assert_eq!(t, "hello\nthere\n");
        apply_change(&mut t, None, "x");
        assert_eq!(t, "x");
    }
}
