//! Capacity as an exact number: millionths of a unit in a `u64`.
//!
//! SPEC §12 lets capacities be fractions (the paper's tables give 45.6 and
//! 34.4), but the invariants a lease server promises — never more than the
//! capacity in all, never more than a client wants — are comparisons of
//! sums, and sums of floats drift: `0.1 + 0.2 > 0.3`. So every capacity,
//! want and lease is a whole number of millionths, sums are exact, and an
//! algorithm's share is rounded **down** to the millionth (the rounding
//! never over-commits; what it leaves on the table is below one millionth
//! per client).

use std::fmt;

use serde::{Serialize, Serializer};

use crate::{ClientError, MAX_COUNT};

/// An amount of capacity (a resource's capacity, a want, a lease), in
/// millionths of a unit, from 0 to [`Quantity::MAX`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(u64);

impl Quantity {
    /// Millionths per unit: the resolution of every capacity.
    pub const SCALE: u64 = 1_000_000;

    /// No capacity.
    pub const ZERO: Quantity = Quantity(0);

    /// The largest amount: 2^53 − 1 millionths (about 9.007 × 10^9
    /// units), so that every amount is exact in a JSON number or a Lua
    /// number, as every count in Charon is ([`MAX_COUNT`]).
    pub const MAX: Quantity = Quantity(MAX_COUNT);

    /// `micros` millionths; `None` above [`Quantity::MAX`].
    pub fn from_micros(micros: u64) -> Option<Self> {
        (micros <= MAX_COUNT).then_some(Self(micros))
    }

    /// `n` whole units; `None` above [`Quantity::MAX`].
    pub fn units(n: u64) -> Option<Self> {
        n.checked_mul(Self::SCALE).and_then(Self::from_micros)
    }

    /// A number from the network or a file, rounded to the nearest
    /// millionth. NaN, infinities, negative numbers and numbers above
    /// [`Quantity::MAX`] are refused with a message that names `field`:
    /// a lease server that took `wants: NaN` would poison every sum.
    pub fn parse(field: &str, value: f64) -> Result<Self, ClientError> {
        if value.is_nan() {
            return Err(ClientError::invalid(format!("{field} is not a number")));
        }
        if value < 0.0 {
            return Err(ClientError::invalid(format!(
                "{field} is {value}; capacities start at 0"
            )));
        }
        let micros = (value * 1e6).round();
        // `Quantity::MAX` as a double is exact (2^53 − 1), and so is the
        // comparison; infinity fails it too.
        if micros > Self::MAX.to_micros_f64() {
            // 1e300 in full is three hundred digits: say it as written.
            let written = if value < 1e15 {
                value.to_string()
            } else {
                format!("{value:e}")
            };
            return Err(ClientError::invalid(format!(
                "{field} is {written}; the largest capacity Charon keeps exactly is {}",
                Self::MAX
            )));
        }
        // In range and integral: the conversion is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let micros = micros as u64;
        Ok(Self(micros))
    }

    /// The amount in millionths.
    pub const fn micros(self) -> u64 {
        self.0
    }

    /// The amount in units as a double, for replies and metrics. Exact in
    /// millionths: every amount is below 2^53.
    pub fn to_f64(self) -> f64 {
        self.to_micros_f64() / 1e6
    }

    /// The millionths as a double (exact: below 2^53).
    #[allow(clippy::cast_precision_loss)]
    fn to_micros_f64(self) -> f64 {
        self.0 as f64
    }

    /// The smaller of two amounts.
    pub fn min(self, other: Self) -> Self {
        Self(self.0.min(other.0))
    }

    /// `self − other`, or zero.
    pub fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }

    /// An exact total in millionths as an amount, [`Quantity::MAX`] if it is
    /// larger (totals of `none` and `static` leases are not bounded by a
    /// capacity).
    pub fn saturating_from_total(micros: u128) -> Self {
        u64::try_from(micros)
            .ok()
            .and_then(Self::from_micros)
            .unwrap_or(Self::MAX)
    }
}

impl fmt::Display for Quantity {
    /// Units with up to six decimals and no trailing zeros: `10`, `45.555555`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (units, frac) = (self.0 / Self::SCALE, self.0 % Self::SCALE);
        if frac == 0 {
            write!(f, "{units}")
        } else {
            let digits = format!("{frac:06}");
            write!(f, "{units}.{}", digits.trim_end_matches('0'))
        }
    }
}

impl Serialize for Quantity {
    /// A JSON number in units: an integer when whole (`10`), else a
    /// fraction (`45.555555`), as SPEC §12 answers capacities.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.is_multiple_of(Self::SCALE) {
            serializer.serialize_u64(self.0 / Self::SCALE)
        } else {
            serializer.serialize_f64(self.to_f64())
        }
    }
}

/// `floor(a × b / c)` exactly, for `b ≤ c` and `c > 0` (the result is then
/// at most `a`, so it fits). The product may need up to 256 bits, which
/// `u128` does not have; this is long multiplication in base 2 that keeps
/// the quotient and the remainder of the partial product, so nothing
/// overflows. `None` if `b > c` or `c = 0`.
pub(crate) fn mul_div_floor(a: u128, b: u128, c: u128) -> Option<u128> {
    if c == 0 || b > c {
        return None;
    }
    // Invariant: (the bits of a seen so far) × b = q × c + r, with r < c.
    let (mut q, mut r) = (0u128, 0u128);
    for bit in (0..u128::BITS).rev() {
        // Double: 2q·c + 2r; carry one c out of 2r when 2r ≥ c, written
        // so that 2r is never formed (it may not fit).
        q <<= 1;
        if r >= c - r {
            r -= c - r;
            q += 1;
        } else {
            r <<= 1;
        }
        if (a >> bit) & 1 == 1 {
            // Add b: r + b ≥ c ⇔ r ≥ c − b (b ≤ c), again without forming
            // the sum.
            if r >= c - b {
                r -= c - b;
                q += 1;
            } else {
                r += b;
            }
        }
    }
    Some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rounds_to_millionths_and_refuses_what_is_not_a_capacity() {
        assert_eq!(
            Quantity::parse("wants", 0.1).map(Quantity::micros),
            Ok(100_000)
        );
        assert_eq!(
            Quantity::parse("wants", 45.6).map(Quantity::micros),
            Ok(45_600_000)
        );
        assert_eq!(Quantity::parse("wants", 0.0), Ok(Quantity::ZERO));
        assert_eq!(
            Quantity::parse("wants", 1e-7).map(Quantity::micros),
            Ok(0),
            "below half a millionth rounds to nothing"
        );
        for bad in [
            f64::NAN,
            -1.0,
            -1e-9,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e10,
        ] {
            let e = Quantity::parse("wants", bad);
            assert!(
                matches!(&e, Err(ClientError::InvalidArgument(m)) if m.starts_with("wants ")),
                "{bad}: {e:?}"
            );
        }
        assert_eq!(
            Quantity::parse("has", 9_007_199_254.0).map(Quantity::micros),
            Ok(9_007_199_254_000_000)
        );
        assert!(Quantity::parse("has", 9_007_199_255.0).is_err());
    }

    #[test]
    fn units_and_bounds() {
        assert_eq!(Quantity::units(3).map(Quantity::micros), Some(3_000_000));
        assert_eq!(Quantity::units(9_007_199_255), None);
        assert_eq!(Quantity::from_micros(MAX_COUNT + 1), None);
        assert_eq!(Quantity::saturating_from_total(u128::MAX), Quantity::MAX);
        assert_eq!(
            Quantity::saturating_from_total(7),
            Quantity::from_micros(7).unwrap_or_default()
        );
    }

    #[test]
    fn shown_and_serialized_in_units() {
        let q = |m| Quantity::from_micros(m).unwrap_or_default();
        assert_eq!(q(10_000_000).to_string(), "10");
        assert_eq!(q(45_555_555).to_string(), "45.555555");
        assert_eq!(q(34_400_000).to_string(), "34.4");
        assert_eq!(q(1).to_string(), "0.000001");
        assert_eq!(serde_json::json!(q(10_000_000)).to_string(), "10");
        assert_eq!(serde_json::json!(q(45_600_000)).to_string(), "45.6");
        assert_eq!(serde_json::json!(q(1)).to_string(), "1e-6");
        assert_eq!(q(34_400_000).to_f64(), 34.4);
    }

    #[test]
    fn mul_div_floor_is_exact_beyond_128_bits() {
        assert_eq!(mul_div_floor(7, 2, 3), Some(4));
        assert_eq!(mul_div_floor(0, 0, 1), Some(0));
        assert_eq!(
            mul_div_floor(u128::MAX, u128::MAX, u128::MAX),
            Some(u128::MAX)
        );
        assert_eq!(mul_div_floor(u128::MAX, 1, u128::MAX), Some(1));
        assert_eq!(
            mul_div_floor(u128::MAX, u128::MAX - 1, u128::MAX),
            Some(u128::MAX - 1)
        );
        // (2^127 + 1) × 2^126 / 2^127 = 2^126 + 1/2 → 2^126.
        assert_eq!(
            mul_div_floor((1 << 127) + 1, 1 << 126, 1 << 127),
            Some(1 << 126)
        );
        // 10^30 × (10^30 − 1) / 10^30 = 10^30 − 1.
        let e30 = 10u128.pow(30);
        assert_eq!(mul_div_floor(e30, e30 - 1, e30), Some(e30 - 1));
        assert_eq!(mul_div_floor(1, 2, 1), None);
        assert_eq!(mul_div_floor(1, 0, 0), None);
    }

    proptest::proptest! {
        #[test]
        fn mul_div_floor_agrees_with_u128_where_the_product_fits(
            a in 0u128..(1 << 64), b in 0u128..(1 << 63), extra in 0u128..(1 << 63)
        ) {
            let c = b + extra + 1;
            proptest::prop_assert_eq!(mul_div_floor(a, b, c), Some(a * b / c));
        }
    }
}
