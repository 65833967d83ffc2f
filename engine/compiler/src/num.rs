//! Exact numbers and units. Every number in a recipe is an exact rational over i128, so unit
//! conversions are exact (1.GiB == 1024.MiB is true) and overflow is an error, never a wrap.

use serde::Serialize;
use std::cmp::Ordering;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Q {
    num: i128,
    den: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    // On magnitudes: `i128::MIN.abs()` overflows. Only gcd(MIN, 0) or gcd(MIN, MIN) exceeds
    // i128::MAX, and `Q::new` rejects MIN before it gets here.
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i128::try_from(a).unwrap_or(1)
}

impl Q {
    pub const ZERO: Q = Q { num: 0, den: 1 };
    pub const ONE: Q = Q { num: 1, den: 1 };
    pub fn int(n: i128) -> Q {
        Q { num: n, den: 1 }
    }
    pub fn new(num: i128, den: i128) -> Option<Q> {
        // i128::MIN has no negation: keeping it out makes every `Q` negatable.
        if den == 0 || num == i128::MIN || den == i128::MIN {
            return None;
        }
        let g = gcd(num, den).max(1);
        let (mut n, mut d) = (num / g, den / g);
        if d < 0 {
            n = n.checked_neg()?;
            d = d.checked_neg()?;
        }
        Some(Q { num: n, den: d })
    }
    pub fn is_integer(self) -> bool {
        self.den == 1
    }
    pub fn to_i128(self) -> Option<i128> {
        self.is_integer().then_some(self.num)
    }
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }
    pub fn checked_add(self, o: Q) -> Option<Q> {
        let g = gcd(self.den, o.den).max(1);
        let l = self.den.checked_mul(o.den / g)?;
        let a = self.num.checked_mul(l / self.den)?;
        let b = o.num.checked_mul(l / o.den)?;
        Q::new(a.checked_add(b)?, l)
    }
    pub fn checked_neg(self) -> Option<Q> {
        Some(Q { num: self.num.checked_neg()?, den: self.den })
    }
    pub fn checked_sub(self, o: Q) -> Option<Q> {
        self.checked_add(o.checked_neg()?)
    }
    pub fn checked_mul(self, o: Q) -> Option<Q> {
        // Cross-reduce first so products of exact unit factors rarely overflow.
        let g1 = gcd(self.num, o.den).max(1);
        let g2 = gcd(o.num, self.den).max(1);
        Q::new((self.num / g1).checked_mul(o.num / g2)?, (self.den / g2).checked_mul(o.den / g1)?)
    }
    pub fn checked_div(self, o: Q) -> Option<Q> {
        if o.num == 0 {
            return None;
        }
        self.checked_mul(Q::new(o.den, o.num)?)
    }
    /// Remainder of the truncated division (integers: `7 % 3 == 1`).
    pub fn checked_rem(self, o: Q) -> Option<Q> {
        if o.num == 0 {
            return None;
        }
        let q = self.checked_div(o)?;
        let t = Q::int(q.num / q.den);
        self.checked_sub(t.checked_mul(o)?)
    }
    pub fn floor(self) -> Q {
        Q::int(self.num.div_euclid(self.den))
    }
    pub fn ceil(self) -> Q {
        let f = self.num.div_euclid(self.den);
        Q::int(if self.num.rem_euclid(self.den) == 0 { f } else { f + 1 })
    }
    pub fn is_negative(self) -> bool {
        self.num < 0
    }

    /// Reads a literal as written: `32`, `1_000`, `0.28`, `1e-6`, `4.02e9`, `8k`, `1.5M`.
    pub fn parse_literal(text: &str) -> Option<Q> {
        let mut s: String = text.chars().filter(|c| *c != '_').collect();
        let mut scale = Q::ONE;
        if let Some(stripped) = s.strip_suffix('k') {
            s = stripped.to_string();
            scale = Q::int(1_000);
        } else if let Some(stripped) = s.strip_suffix('M') {
            s = stripped.to_string();
            scale = Q::int(1_000_000);
        }
        let (mantissa, exp) = match s.find(['e', 'E']) {
            Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
            None => (s.as_str(), 0),
        };
        let (int_part, frac_part) = match mantissa.find('.') {
            Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
            None => (mantissa, ""),
        };
        if int_part.is_empty()
            || !int_part.bytes().all(|b| b.is_ascii_digit())
            || !frac_part.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let digits = format!("{int_part}{frac_part}");
        let n: i128 = digits.parse().ok()?;
        let exp10 = exp.checked_sub(frac_part.len() as i32)?;
        if exp10.unsigned_abs() > 38 {
            return None;
        }
        let p = 10i128.checked_pow(exp10.unsigned_abs())?;
        let q = if exp10 >= 0 { Q::new(n.checked_mul(p)?, 1)? } else { Q::new(n, p)? };
        q.checked_mul(scale)
    }
}

impl PartialOrd for Q {
    fn partial_cmp(&self, o: &Q) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Q {
    fn cmp(&self, o: &Q) -> Ordering {
        // a/b vs c/d with b,d > 0: compare a*d and c*b; fall back to f64 if that overflows.
        match (self.num.checked_mul(o.den), o.num.checked_mul(self.den)) {
            (Some(l), Some(r)) => l.cmp(&r),
            _ => self.to_f64().partial_cmp(&o.to_f64()).unwrap_or(Ordering::Equal),
        }
    }
}

impl fmt::Display for Q {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            return write!(f, "{}", self.num);
        }
        // Exact decimal when the denominator has only factors 2 and 5 (it does for literals).
        let mut d = self.den;
        let (mut twos, mut fives) = (0u32, 0u32);
        while d % 2 == 0 {
            d /= 2;
            twos += 1;
        }
        while d % 5 == 0 {
            d /= 5;
            fives += 1;
        }
        let places = twos.max(fives);
        if d == 1 && places <= 30 {
            if let Some(scaled) = 10i128.checked_pow(places).and_then(|p| self.num.checked_mul(p / self.den)) {
                let neg = scaled < 0;
                let digits = scaled.unsigned_abs().to_string();
                let places = places as usize;
                let padded = if digits.len() <= places {
                    format!("{}{}", "0".repeat(places - digits.len() + 1), digits)
                } else {
                    digits
                };
                let (i, frac) = padded.split_at(padded.len() - places);
                let frac = frac.trim_end_matches('0');
                return write!(
                    f,
                    "{}{}{}{}",
                    if neg { "-" } else { "" },
                    i,
                    if frac.is_empty() { "" } else { "." },
                    frac
                );
            }
        }
        write!(f, "{}", self.to_f64())
    }
}

impl Serialize for Q {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.to_i128() {
            Some(i) if i.unsigned_abs() < (1u128 << 53) => s.serialize_i64(i as i64),
            _ => s.serialize_f64(self.to_f64()),
        }
    }
}

/// A physical dimension: exponents of bytes, seconds, steps, tokens and FLOPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Dim(pub [i8; 5]);

impl Dim {
    pub const NONE: Dim = Dim([0; 5]);
    pub const BYTES: Dim = Dim([1, 0, 0, 0, 0]);
    pub const TIME: Dim = Dim([0, 1, 0, 0, 0]);
    pub const STEPS: Dim = Dim([0, 0, 1, 0, 0]);
    pub const TOKENS: Dim = Dim([0, 0, 0, 1, 0]);
    pub const BANDWIDTH: Dim = Dim([1, -1, 0, 0, 0]);
    pub const COMPUTE: Dim = Dim([0, -1, 0, 0, 1]);
    pub fn is_none(self) -> bool {
        self == Dim::NONE
    }
    pub fn times(self, o: Dim) -> Dim {
        let mut r = [0i8; 5];
        for (i, v) in r.iter_mut().enumerate() {
            *v = self.0[i].saturating_add(o.0[i]);
        }
        Dim(r)
    }
    pub fn per(self, o: Dim) -> Dim {
        let mut r = [0i8; 5];
        for (i, v) in r.iter_mut().enumerate() {
            *v = self.0[i].saturating_sub(o.0[i]);
        }
        Dim(r)
    }
    /// The type name users see: `Bytes`, `Duration`, ...
    pub fn name(self) -> String {
        for (name, d) in QUANTITY_TYPES {
            if *d == self {
                return name.to_string();
            }
        }
        let names = ["B", "s", "steps", "tokens", "FLOP"];
        let mut parts = Vec::new();
        for (i, e) in self.0.iter().enumerate() {
            match e {
                0 => {}
                1 => parts.push(names[i].to_string()),
                e => parts.push(format!("{}^{}", names[i], e)),
            }
        }
        if parts.is_empty() {
            "number".into()
        } else {
            parts.join("·")
        }
    }
}

/// The named quantity types of the language.
pub const QUANTITY_TYPES: &[(&str, Dim)] = &[
    ("Bytes", Dim::BYTES),
    ("Duration", Dim::TIME),
    ("Steps", Dim::STEPS),
    ("Tokens", Dim::TOKENS),
    ("Bandwidth", Dim::BANDWIDTH),
    ("Compute", Dim::COMPUTE),
];

/// A unit: its dimension and its size in base units (bytes, seconds, steps, tokens, FLOP).
pub fn unit(name: &str) -> Option<(Dim, Q)> {
    let p10 = |e: u32| Q::int(10i128.pow(e));
    let p2 = |e: u32| Q::int(1i128 << e);
    let r = match name {
        "B" => (Dim::BYTES, Q::ONE),
        "KB" => (Dim::BYTES, p10(3)),
        "MB" => (Dim::BYTES, p10(6)),
        "GB" => (Dim::BYTES, p10(9)),
        "TB" => (Dim::BYTES, p10(12)),
        "KiB" => (Dim::BYTES, p2(10)),
        "MiB" => (Dim::BYTES, p2(20)),
        "GiB" => (Dim::BYTES, p2(30)),
        "TiB" => (Dim::BYTES, p2(40)),
        "ms" => (Dim::TIME, Q::new(1, 1000)?),
        "s" => (Dim::TIME, Q::ONE),
        "min" => (Dim::TIME, Q::int(60)),
        "h" => (Dim::TIME, Q::int(3600)),
        "step" | "steps" => (Dim::STEPS, Q::ONE),
        "token" | "tokens" => (Dim::TOKENS, Q::ONE),
        "B/s" => (Dim::BANDWIDTH, Q::ONE),
        "KB/s" => (Dim::BANDWIDTH, p10(3)),
        "MB/s" => (Dim::BANDWIDTH, p10(6)),
        "GB/s" => (Dim::BANDWIDTH, p10(9)),
        "TB/s" => (Dim::BANDWIDTH, p10(12)),
        "GiB/s" => (Dim::BANDWIDTH, p2(30)),
        "FLOP/s" => (Dim::COMPUTE, Q::ONE),
        "GFLOP/s" => (Dim::COMPUTE, p10(9)),
        "TFLOP/s" => (Dim::COMPUTE, p10(12)),
        "PFLOP/s" => (Dim::COMPUTE, p10(15)),
        _ => return None,
    };
    Some(r)
}

pub const UNIT_NAMES: &[&str] = &[
    "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "ms", "s", "min", "h", "steps", "tokens", "B/s", "KB/s",
    "MB/s", "GB/s", "TB/s", "GiB/s", "FLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s",
];

/// Shows a quantity in the most readable unit of its dimension.
pub fn format_quantity(q: Q, dim: Dim) -> String {
    let choices: &[(&str, Q)] = &[];
    let pick = |list: &[(&'static str, i128)]| -> String {
        let v = q.to_f64().abs();
        let mut best = list[0];
        for &(u, size) in list {
            if v >= size as f64 {
                best = (u, size);
            }
        }
        let scaled = q.checked_div(Q::int(best.1)).unwrap_or(q);
        if scaled.is_integer() {
            format!("{}.{}", scaled, best.0)
        } else {
            let f = scaled.to_f64();
            let s = format!("{:.3}", f);
            let s = s.trim_end_matches('0').trim_end_matches('.');
            format!("{}.{}", s, best.0)
        }
    };
    let _ = choices;
    match dim {
        d if d == Dim::BYTES => {
            pick(&[("B", 1), ("KB", 1_000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("TB", 1_000_000_000_000)])
        }
        d if d == Dim::TIME => {
            if q < Q::ONE && !q.is_negative() && q != Q::ZERO {
                let ms = q.checked_mul(Q::int(1000)).unwrap_or(q);
                return format!("{}.ms", ms);
            }
            pick(&[("s", 1), ("min", 60), ("h", 3600)])
        }
        d if d == Dim::STEPS => format!("{}.steps", q),
        d if d == Dim::TOKENS => format!("{}.tokens", q),
        d if d == Dim::BANDWIDTH => pick(&[
            ("B/s", 1),
            ("KB/s", 1_000),
            ("MB/s", 1_000_000),
            ("GB/s", 1_000_000_000),
            ("TB/s", 1_000_000_000_000),
        ]),
        d if d == Dim::COMPUTE => pick(&[
            ("FLOP/s", 1),
            ("GFLOP/s", 1_000_000_000),
            ("TFLOP/s", 1_000_000_000_000),
            ("PFLOP/s", 1_000_000_000_000_000),
        ]),
        d => format!("{} {}", q, d.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> Q {
        Q::parse_literal(s).unwrap()
    }

    #[test]
    fn literals_are_exact() {
        assert_eq!(lit("1_000"), Q::int(1000));
        assert_eq!(lit("0.28"), Q::new(7, 25).unwrap());
        assert_eq!(lit("1e-6"), Q::new(1, 1_000_000).unwrap());
        assert_eq!(lit("4.02e9"), Q::int(4_020_000_000));
        assert_eq!(lit("8k"), Q::int(8000));
        assert_eq!(lit("1.5M"), Q::int(1_500_000));
        assert_eq!(Q::parse_literal("99999999999999999999999999999999999999999"), None);
        assert_eq!(Q::parse_literal("1e99"), None);
    }

    #[test]
    fn unit_conversions_are_exact() {
        let gib = unit("GiB").unwrap().1;
        let mib = unit("MiB").unwrap().1;
        assert_eq!(gib, Q::int(1024).checked_mul(mib).unwrap());
        let tenth_s = lit("0.1").checked_mul(unit("s").unwrap().1).unwrap();
        assert_eq!(tenth_s, Q::int(100).checked_mul(unit("ms").unwrap().1).unwrap());
        assert_eq!(unit("GB/s").unwrap().0, Dim::BYTES.per(Dim::TIME));
    }

    #[test]
    fn display() {
        assert_eq!(lit("0.28").to_string(), "0.28");
        assert_eq!(lit("1e-6").to_string(), "0.000001");
        assert_eq!(Q::new(-5, 2).unwrap().to_string(), "-2.5");
        assert_eq!(format_quantity(lit("279e9"), Dim::BYTES), "279.GB");
        assert_eq!(format_quantity(lit("1.5"), Dim::TIME), "1.5.s");
        assert_eq!(format_quantity(lit("0.25"), Dim::TIME), "250.ms");
    }

    #[test]
    fn overflow_is_none() {
        let big = Q::int(i128::MAX / 2);
        assert!(big.checked_mul(Q::int(4)).is_none());
        assert!(Q::ONE.checked_div(Q::ZERO).is_none());
        assert_eq!(Q::int(7).checked_rem(Q::int(3)), Some(Q::int(1)));
        // -i128::MAX - 1 is i128::MIN, which has no negation: an overflow, not a panic.
        let min_plus_one = Q::int(-i128::MAX);
        assert_eq!(min_plus_one.checked_sub(Q::ONE), None);
        assert_eq!(Q::new(i128::MIN, 1), None);
        assert_eq!(Q::new(1, i128::MIN), None);
    }
}
