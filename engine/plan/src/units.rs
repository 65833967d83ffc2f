//! How the plan writes quantities: bytes, bandwidths, counts and durations.

/// Bytes as the plan prints them in its tables and summaries: MB below 0.1 GB, one decimal up
/// to 100 GB, none above (`512.0 MB`, `74.3 GB`, `245 GB`). The language server's hints use it
/// too, so the editor and `miles plan` agree.
pub fn gb(bytes: u64) -> String {
    let x = bytes as f64 / 1e9;
    if bytes > 0 && x < 0.1 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else if x >= 100.0 {
        format!("{x:.0} GB")
    } else {
        format!("{x:.1} GB")
    }
}

/// A count with a k or M suffix once it is long (`24k`, `1.5M`).
pub(crate) fn count(n: u64) -> String {
    let x = n as f64;
    if n >= 10_000_000 {
        format!("{:.0}M", x / 1e6)
    } else if n >= 1_000_000 {
        format!("{:.1}M", x / 1e6)
    } else if n >= 10_000 {
        format!("{:.0}k", x / 1e3)
    } else {
        n.to_string()
    }
}

/// A parameter count with one decimal and a k, M or B suffix (`6.3M`, `1.69B`).
pub(crate) fn params(n: u64) -> String {
    let x = n as f64;
    if n >= 1_000_000_000 {
        format!("{:.2}B", x / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.1}M", x / 1e6)
    } else if n >= 1_000 {
        format!("{:.1}k", x / 1e3)
    } else {
        n.to_string()
    }
}

/// Seconds with the precision a reader needs: `-` when unknown, ms below a second.
pub fn secs(s: f64) -> String {
    if !s.is_finite() || s == 0.0 {
        "-".into()
    } else if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1e3)
    }
}

/// Seconds as `secs` writes them, with two decimals of a millisecond below 10 ms: for figures
/// that small on a laptop model (a data-parallel trainer's collectives) and not 0 there.
pub(crate) fn secs_fine(s: f64) -> String {
    if s.is_finite() && s > 0.0 && s < 0.01 {
        format!("{:.2} ms", s * 1e3)
    } else {
        secs(s)
    }
}

/// Bytes with always one decimal (`279.0 GB`), as the assumptions and diagnostics write them:
/// figures there are compared with each other, so their precision does not vary.
pub(crate) fn gb_fixed(bytes: f64) -> String {
    format!("{:.1} GB", bytes / 1e9)
}

/// [`gb_fixed`], or MB with one decimal below 0.1 GB (a LoRA update is megabytes).
pub(crate) fn bytes_fixed(bytes: f64) -> String {
    if bytes > 0.0 && bytes < 1e8 {
        format!("{:.1} MB", bytes / 1e6)
    } else {
        gb_fixed(bytes)
    }
}

/// Bytes per second, whole GB/s.
pub(crate) fn gbs(bytes_per_s: f64) -> String {
    format!("{:.0} GB/s", bytes_per_s / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(gb(0), "0.0 GB");
        assert_eq!(gb(512_000_000 / 10), "51.2 MB");
        assert_eq!(gb(74_300_000_000), "74.3 GB");
        assert_eq!(gb(245_000_000_000), "245 GB");
        assert_eq!(gb_fixed(279e9), "279.0 GB");
        assert_eq!(
            (bytes_fixed(53.5e6), bytes_fixed(0.1e9), bytes_fixed(0.0)),
            ("53.5 MB".into(), "0.1 GB".into(), "0.0 GB".into())
        );
        assert_eq!(gbs(80e9), "80 GB/s");
        assert_eq!(
            [params(950), params(6_300_000), params(13_369_344), params(1_690_000_000)],
            ["950", "6.3M", "13.4M", "1.69B"]
        );
    }
}
