//! The mergeable sketches a bucket keeps, and their stored encoding.
//!
//! Percentiles do not compose and distinct counts do not add, so a bucket
//! stores sketches that do, and an hour or a day is the merge of its parts.
//! Both kinds are stored as `bytea` whose first byte is
//! [`SKETCH_FORMAT`]; the rest is a published, cross-language format:
//!
//! - [`Quantiles`]: a DDSketch with relative accuracy [`QUANTILE_ACCURACY`]
//!   (logarithmic mapping, 2048 bins), encoded in DataDog's binary DDSketch
//!   format (`DDSketchWithExactSummaryStatistics`, as `sketches-java`
//!   writes it, with its version byte 2 in front). A quantile it returns is within that relative error of
//!   the exact value at the same rank, `⌊q·(n−1)⌋` of the sorted values.
//! - [`Distinct`]: an Apache DataSketches HyperLogLog with
//!   `lg_k` = [`DISTINCT_LG_K`] (relative standard error about 0.8 %,
//!   exact while small), in the DataSketches HLL serialization (HLL_4).
//!
//! A format byte other than [`SKETCH_FORMAT`] is refused by name, so a
//! later encoding can be introduced next to this one.

use datasketches::hll::{HllSketch, HllType, HllUnion};
use sketches_ddsketch::{Config, DDSketch};

/// The first byte of every stored sketch.
pub const SKETCH_FORMAT: u8 = 1;
/// Relative accuracy of the quantile sketches: half of the 1 % promised.
pub const QUANTILE_ACCURACY: f64 = 0.005;
/// Register count (log2) of the distinct-count sketches.
pub const DISTINCT_LG_K: u8 = 14;

const QUANTILE_BINS: u32 = 2048;
const DDSKETCH_VERSION: u8 = 2;
const QUANTILE_MIN_VALUE: f64 = 1.0e-9;

/// A stored sketch that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SketchError {
    /// The value holds no byte at all.
    #[error("{column}: empty sketch")]
    Empty {
        /// The stored column it came from.
        column: &'static str,
    },
    /// The first byte is not [`SKETCH_FORMAT`]: written by another build.
    #[error("{column}: sketch format {found} is not known (this build reads format {SKETCH_FORMAT})")]
    UnknownFormat {
        /// The stored column it came from.
        column: &'static str,
        /// Its first byte.
        found: u8,
    },
    /// The bytes after the format byte do not decode, or decode to a
    /// sketch of another configuration.
    #[error("{column}: {reason}")]
    Corrupt {
        /// The stored column it came from.
        column: &'static str,
        /// What the decoder said.
        reason: String,
    },
}

fn payload<'a>(column: &'static str, bytes: &'a [u8]) -> Result<&'a [u8], SketchError> {
    match bytes.split_first() {
        None => Err(SketchError::Empty { column }),
        Some((&SKETCH_FORMAT, rest)) => Ok(rest),
        Some((&found, _)) => Err(SketchError::UnknownFormat { column, found }),
    }
}

fn config() -> Config {
    Config::new(QUANTILE_ACCURACY, QUANTILE_BINS, QUANTILE_MIN_VALUE)
}

/// Quantiles of non-negative values (milliseconds, bytes).
#[derive(Clone)]
pub struct Quantiles(DDSketch);

impl std::fmt::Debug for Quantiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quantiles").field("count", &self.count()).finish_non_exhaustive()
    }
}

impl Default for Quantiles {
    fn default() -> Self {
        Self(DDSketch::new(config()))
    }
}

impl Quantiles {
    /// Adds one value; a negative one counts as 0, and NaN or an infinity
    /// is ignored.
    pub fn add(&mut self, value: f64) {
        if value.is_finite() {
            self.0.add(value.max(0.0));
        }
    }

    /// Adds every value `other` saw.
    pub fn merge(&mut self, other: &Quantiles) {
        // Every sketch here is built from `config()` or decoded from bytes
        // it wrote, whose mapping decodes to the same configuration.
        if self.0.merge(&other.0).is_err() {
            tracing::error!("quantile sketches with different mappings; the merge kept the left one");
        }
    }

    /// How many values were added.
    pub fn count(&self) -> u64 {
        self.0.count() as u64
    }

    /// The value at rank `⌊q·(n−1)⌋`, or `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.0.quantile(q.clamp(0.0, 1.0)).ok().flatten()
    }

    /// The stored form: [`SKETCH_FORMAT`], then the DDSketch bytes.
    pub fn encode(&self) -> Vec<u8> {
        // DataDog's optional version byte (2) is always written: without
        // it, an empty sketch starts with the index-mapping flag (also 2),
        // which the decoder would take for the version byte and skip.
        let mut bytes = vec![SKETCH_FORMAT, DDSKETCH_VERSION];
        bytes.extend(self.0.to_java_bytes());
        bytes
    }

    /// Reads what [`Quantiles::encode`] wrote; `column` names the source
    /// in errors.
    pub fn decode(column: &'static str, bytes: &[u8]) -> Result<Self, SketchError> {
        let sketch = DDSketch::from_java_bytes(payload(column, bytes)?)
            .map_err(|e| SketchError::Corrupt { column, reason: format!("{e:?}") })?;
        let mut empty = Self::default();
        // Checks the decoded mapping is ours: a merge refuses any other.
        empty
            .0
            .merge(&sketch)
            .map_err(|_| SketchError::Corrupt { column, reason: "a DDSketch with another index mapping".into() })?;
        Ok(empty)
    }
}

/// An estimate of how many distinct values were added.
pub struct Distinct(HllUnion);

impl std::fmt::Debug for Distinct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Distinct").field("estimate", &self.estimate()).finish()
    }
}

impl Default for Distinct {
    fn default() -> Self {
        Self(HllUnion::new(DISTINCT_LG_K).expect("DISTINCT_LG_K is within DataSketches' range"))
    }
}

impl Clone for Distinct {
    fn clone(&self) -> Self {
        let mut copy = Self::default();
        copy.0.update(&self.0.to_sketch(HllType::Hll8));
        copy
    }
}

impl Distinct {
    /// Adds one value; adding it again changes nothing.
    pub fn add(&mut self, value: &str) {
        self.0.update_value(value);
    }

    /// Adds every value `other` saw.
    pub fn merge(&mut self, other: &Distinct) {
        self.0.update(&other.0.to_sketch(HllType::Hll8));
    }

    /// The estimated number of distinct values.
    pub fn estimate(&self) -> f64 {
        self.0.estimate()
    }

    /// Whether no value was added.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The stored form: [`SKETCH_FORMAT`], then the HLL_4 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![SKETCH_FORMAT];
        bytes.extend(self.0.to_sketch(HllType::Hll4).serialize());
        bytes
    }

    /// Reads what [`Distinct::encode`] wrote; `column` names the source in
    /// errors.
    pub fn decode(column: &'static str, bytes: &[u8]) -> Result<Self, SketchError> {
        let sketch = HllSketch::deserialize(payload(column, bytes)?)
            .map_err(|e| SketchError::Corrupt { column, reason: e.to_string() })?;
        let mut distinct = Self::default();
        distinct.0.update(&sketch);
        Ok(distinct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_round_trip_and_merge_within_accuracy() {
        let mut left = Quantiles::default();
        let mut right = Quantiles::default();
        let mut exact = Vec::new();
        for i in 1..=10_000u32 {
            let v = f64::from(i) * 1.37;
            exact.push(v);
            if i % 2 == 0 { left.add(v) } else { right.add(v) }
        }
        let mut merged = Quantiles::decode("latency_sketch", &left.encode()).expect("decodes");
        merged.merge(&Quantiles::decode("latency_sketch", &right.encode()).expect("decodes"));
        assert_eq!(merged.count(), 10_000);
        for q in [0.5, 0.95, 0.99] {
            let rank = (q * (exact.len() as f64 - 1.0)).floor() as usize;
            let want = exact[rank];
            let got = merged.quantile(q).expect("not empty");
            assert!(((got - want) / want).abs() <= QUANTILE_ACCURACY + 1e-12, "q{q}: {got} vs {want}");
        }
    }

    #[test]
    fn empty_sketches_round_trip() {
        let empty = Quantiles::decode("latency_sketch", &Quantiles::default().encode()).expect("decodes");
        assert_eq!((empty.count(), empty.quantile(0.5)), (0, None));
        let empty = Distinct::decode("users_sketch", &Distinct::default().encode()).expect("decodes");
        assert_eq!(empty.estimate(), 0.0);
    }

    #[test]
    fn distinct_round_trips_and_merges() {
        let mut left = Distinct::default();
        let mut right = Distinct::default();
        for i in 0..5_000 {
            left.add(&format!("s{i}"));
            right.add(&format!("s{}", i + 2_500));
        }
        let mut merged = Distinct::decode("sessions_sketch", &left.encode()).expect("decodes");
        merged.merge(&Distinct::decode("sessions_sketch", &right.encode()).expect("decodes"));
        let estimate = merged.estimate();
        assert!((estimate - 7_500.0).abs() / 7_500.0 < 0.02, "{estimate}");
    }

    #[test]
    fn unknown_formats_and_garbage_are_refused_by_column() {
        let mut bytes = Quantiles::default().encode();
        bytes[0] = 9;
        let error = Quantiles::decode("size_sketch", &bytes).expect_err("format 9");
        assert_eq!(error.to_string(), "size_sketch: sketch format 9 is not known (this build reads format 1)");
        assert!(matches!(Distinct::decode("users_sketch", &[]), Err(SketchError::Empty { column: "users_sketch" })));
        assert!(matches!(
            Distinct::decode("users_sketch", &[SKETCH_FORMAT, 1, 2, 3]),
            Err(SketchError::Corrupt { column: "users_sketch", .. })
        ));
    }
}
