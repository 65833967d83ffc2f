//! Image batches as an SVG grid, for a run's output directory and reports: one grey square per
//! pixel, so the file needs no image codec and stays exact (a browser scales it without blur).

use miles_runtime::{RunError, E_BACKEND, E_SPEC};
use std::fmt::Write as _;
use std::path::Path;
use tch::{Kind, Tensor};

/// Space between images and around the grid, in image pixels.
const GAP: usize = 2;
/// Height of the title band and its font size, in image pixels.
const TITLE_BAND: usize = 8;
const FONT: usize = 5;
/// Screen pixels per image pixel in the SVG's width and height (the viewBox is in image pixels).
const ZOOM: usize = 6;

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 cannot carry other control characters at all.
            c if (c as u32) < 0x20 && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The fill of a pixel: -1 black .. 1 white (clamped); NaN or infinity red, so a diverged sample
/// shows as such instead of as a plausible grey.
fn fill(v: f32) -> String {
    if !v.is_finite() {
        return "#f00".into();
    }
    let g = (((v.clamp(-1.0, 1.0) + 1.0) / 2.0) * 255.0).round() as u8;
    format!("#{g:02x}{g:02x}{g:02x}")
}

/// The SVG text of `images` ([B, 1, H, W]) in rows of `cols`, `title` above.
pub fn grid_svg(images: &Tensor, cols: usize, title: &str) -> Result<String, RunError> {
    let dims = images.size();
    if dims.len() != 4 || dims[1] != 1 {
        return Err(RunError::new(
            E_BACKEND,
            format!("an image grid takes [B, 1, H, W] images, not a tensor of shape {dims:?}"),
        ));
    }
    if cols == 0 {
        return Err(RunError::new(E_SPEC, "an image grid needs at least one column"));
    }
    let (b, h, w) = (dims[0].max(0) as usize, dims[2].max(0) as usize, dims[3].max(0) as usize);
    let px = Vec::<f32>::try_from(images.detach().to_kind(Kind::Float).contiguous().view([-1]))
        .map_err(|e| RunError::new(E_BACKEND, format!("libtorch: {e}")))?;
    let cols = cols.min(b.max(1));
    let rows = b.div_ceil(cols);
    let width = GAP + cols * (w + GAP);
    let height = TITLE_BAND + GAP + rows * (h + GAP);
    let mut s = String::with_capacity(64 + b * h * w * 56);
    // `write!` to a String cannot fail.
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {width} {height}" shape-rendering="crispEdges">"#,
        width * ZOOM,
        height * ZOOM
    );
    let _ = write!(
        s,
        r#"<title>{t}</title><text x="{GAP}" y="{}" font-family="sans-serif" font-size="{FONT}">{t}</text>"#,
        TITLE_BAND - 2,
        t = escape(title)
    );
    s.push('\n');
    for i in 0..b {
        let (x0, y0) = (GAP + (i % cols) * (w + GAP), TITLE_BAND + GAP + (i / cols) * (h + GAP));
        let _ = write!(s, r#"<g transform="translate({x0} {y0})">"#);
        for (j, &v) in px[i * h * w..(i + 1) * h * w].iter().enumerate() {
            let _ = write!(s, r#"<rect x="{}" y="{}" width="1" height="1" fill="{}"/>"#, j % w, j / w, fill(v));
        }
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    Ok(s)
}

/// Writes `grid_svg(images, cols, title)` to `path` atomically (a temp file beside it, renamed),
/// so a reader never sees half a grid.
pub fn write_grid_svg(path: &Path, images: &Tensor, cols: usize, title: &str) -> Result<(), RunError> {
    let svg = grid_svg(images, cols, title)?;
    miles_runtime::exec::write_atomically(path, svg.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_and_escapes() {
        assert_eq!(fill(-1.0), "#000000");
        assert_eq!(fill(1.0), "#ffffff");
        assert_eq!(fill(0.0), "#808080");
        assert_eq!(fill(7.0), "#ffffff");
        assert_eq!(fill(f32::NAN), "#f00");
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }

    #[test]
    fn three_images_in_two_columns_make_two_rows() {
        let x = Tensor::zeros([3, 1, 2, 2], (Kind::Float, tch::Device::Cpu));
        let svg = grid_svg(&x, 2, "t").unwrap();
        // width: gap + 2 * (2 + gap) = 10; height: band 8 + gap + 2 rows * (2 + gap) = 18.
        assert!(svg.contains(r#"viewBox="0 0 10 18""#), "{svg}");
        assert_eq!(svg.matches("<g ").count(), 3);
        assert!(svg.contains(r#"translate(2 14)"#), "{svg}");
        assert!(grid_svg(&x, 0, "t").is_err());
    }
}
