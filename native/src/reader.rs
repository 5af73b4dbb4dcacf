//! The codec's native reader (used by cqrs/codec/binary.py, record_reader and values_reader).
//!
//! It reads the plan the writer reads (`_Generator.plan_record`, plain Python tuples) and
//! builds what the generated Python reader builds: the same objects of the same types (nested
//! records through the same constructor calls), and an exception wherever that reader raises
//! (truncated or trailing bytes, negative lengths, a union index other than the canonical
//! byte, a varint longer than 10 bytes or wider than 64 bits, a bad enum index, bad UTF-8, a
//! time or date outside Python's range...). The codec then decodes again with fastavro, so
//! raising is always safe; reading what fastavro would not read the same way never is.

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;

use crate::plan::{parse_records, Op, Record};
use pyo3::types::{
    PyBool, PyBytes, PyDate, PyDateTime, PyDict, PyFloat, PyList, PyString, PyTuple, PyType,
    PyTzInfo,
};

/// `Reader(records, values, mismatch, utc)`: `reader(data, offset)` returns the instance of the
/// first record whose Avro body is `data[offset:]` (all of it), or with `values` true the tuple
/// of its fields' values.
#[pyclass(frozen, module = "cqrs_native")]
pub struct Reader {
    records: Vec<Record>,
    values: bool,
    mismatch: Py<PyType>,
    utc: Py<PyTzInfo>,
}

/// The bytes being read and the position in them. `None` from any of its methods: the bytes
/// are not what the generated reader reads (the caller raises `Mismatch`).
pub(crate) struct Cursor<'a> {
    pub(crate) d: &'a [u8],
    pub(crate) p: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    pub(crate) fn byte(&mut self) -> Option<u8> {
        let b = *self.d.get(self.p)?;
        self.p += 1;
        Some(b)
    }

    /// A zig-zag varint: at most 10 bytes and 64 bits, as `_rlong` takes (fastavro's C reader
    /// reads longer or wider ones its own way).
    #[inline]
    pub(crate) fn long(&mut self) -> Option<i64> {
        let b = self.byte()?;
        let n: u64 = if b < 0x80 {
            b as u64
        } else {
            let mut n = (b & 0x7F) as u64;
            let mut shift = 7;
            loop {
                let b = self.byte()?;
                if shift == 63 && b > 1 {
                    return None; // an 11th byte, or bits beyond the 64th
                }
                n |= ((b & 0x7F) as u64) << shift;
                if b < 0x80 {
                    break n;
                }
                shift += 7;
            }
        };
        Some((n >> 1) as i64 ^ -((n & 1) as i64))
    }

    /// A length or block count: not negative (fastavro decides what a negative one means).
    #[inline]
    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.long()?).ok()
    }

    /// The bytes of a string or bytes value.
    #[inline]
    pub(crate) fn span(&mut self) -> Option<&'a [u8]> {
        let n = self.count()?;
        let end = self.p.checked_add(n)?;
        let s = self.d.get(self.p..end)?;
        self.p = end;
        Some(s)
    }

    fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        let end = self.p.checked_add(N)?;
        let s: [u8; N] = self.d.get(self.p..end)?.try_into().ok()?;
        self.p = end;
        Some(s)
    }
}

// the days from 1970-01-01 to 0001-01-01 and 9999-12-31: Python's date and datetime range
const MIN_DAYS: i64 = -719_162;
const MAX_DAYS: i64 = 2_932_896;
const DAY_US: i64 = 86_400_000_000;

/// The civil date (proleptic Gregorian) `days` after 1970-01-01, for days in Python's range.
fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468; // from 0000-03-01: leap days come last in each 400-year era
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month as u8, day as u8)
}

impl Reader {
    fn miss(&self, py: Python<'_>) -> PyErr {
        PyErr::from_type(self.mismatch.bind(py).clone(), ())
    }

    /// The fields' values of the record at `index`, in the schema's order.
    fn fields<'py>(
        &self,
        py: Python<'py>,
        c: &mut Cursor<'_>,
        index: usize,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let fields = &self.records[index].fields;
        let mut values = Vec::with_capacity(fields.len());
        for f in fields {
            values.push(self.value(py, c, &f.op)?);
        }
        Ok(values)
    }

    /// The instance of the record at `index`, built as the generated reader builds it.
    fn record<'py>(
        &self,
        py: Python<'py>,
        c: &mut Cursor<'_>,
        index: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut values = self.fields(py, c, index)?;
        let rec = &self.records[index];
        let cls = rec.cls.bind(py);
        if rec.keywords.is_empty() {
            return cls.call1(PyTuple::new(py, values)?);
        }
        let named = values.split_off(values.len() - rec.keywords.len());
        let kwargs = PyDict::new(py);
        for (name, v) in rec.keywords.iter().zip(named) {
            kwargs.set_item(name.bind(py), v)?;
        }
        cls.call(PyTuple::new(py, values)?, Some(&kwargs))
    }

    fn value<'py>(
        &self,
        py: Python<'py>,
        c: &mut Cursor<'_>,
        op: &Op,
    ) -> PyResult<Bound<'py, PyAny>> {
        let miss = || self.miss(py);
        Ok(match op {
            Op::Long | Op::Int => c.long().ok_or_else(miss)?.into_pyobject(py)?.into_any(),
            Op::Double => {
                PyFloat::new(py, f64::from_le_bytes(c.fixed().ok_or_else(miss)?)).into_any()
            }
            Op::Float => {
                PyFloat::new(py, f32::from_le_bytes(c.fixed().ok_or_else(miss)?) as f64).into_any()
            }
            Op::Str => PyString::new(py, text(c.span().ok_or_else(miss)?)?).into_any(),
            Op::Bytes => PyBytes::new(py, c.span().ok_or_else(miss)?).into_any(),
            Op::Bool => match c.byte().ok_or_else(miss)? {
                0 => PyBool::new(py, false).to_owned().into_any(),
                1 => PyBool::new(py, true).to_owned().into_any(),
                _ => return Err(miss()), // `_BOOL[b]`: IndexError
            },
            Op::DateTime => self.datetime(py, c.long().ok_or_else(miss)?)?.into_any(),
            Op::Date => {
                let days = c.long().ok_or_else(miss)?;
                if !(MIN_DAYS..=MAX_DAYS).contains(&days) {
                    return Err(PyValueError::new_err("date ordinal out of range"));
                    // fromordinal's
                }
                let (y, m, d) = civil_from_days(days);
                PyDate::new(py, y, m, d)?.into_any()
            }
            Op::StrOf(cls) => cls
                .bind(py)
                .call1((PyString::new(py, text(c.span().ok_or_else(miss)?)?),))?,
            Op::Enum { members, .. } => {
                // `members[i]` as Python indexes a tuple: from the end for -len <= i < 0
                let i = c.long().ok_or_else(miss)?;
                let n = members.len() as i64;
                let at = if i < 0 { i + n } else { i };
                if !(0..n).contains(&at) {
                    return Err(miss());
                }
                members[at as usize].bind(py).clone()
            }
            Op::Optional(null_first, inner) => {
                let (null, value) = if *null_first { (0, 2) } else { (2, 0) };
                match c.byte().ok_or_else(miss)? {
                    b if b == null => py.None().into_bound(py),
                    b if b == value => self.value(py, c, inner)?,
                    _ => return Err(miss()), // another branch index, or a non-canonical varint
                }
            }
            Op::List(inner, as_tuple) => {
                let mut items = Vec::new();
                let mut count = c.count().ok_or_else(miss)?;
                while count > 0 {
                    // never reserve more than the bytes left could hold (a corrupt count)
                    items.reserve(count.min(c.d.len() - c.p.min(c.d.len())));
                    for _ in 0..count {
                        items.push(self.value(py, c, inner)?);
                    }
                    count = c.count().ok_or_else(miss)?;
                }
                if *as_tuple {
                    PyTuple::new(py, items)?.into_any()
                } else {
                    PyList::new(py, items)?.into_any()
                }
            }
            Op::Map(inner) => {
                let dict = PyDict::new(py);
                let mut count = c.count().ok_or_else(miss)?;
                while count > 0 {
                    for _ in 0..count {
                        let key = PyString::new(py, text(c.span().ok_or_else(miss)?)?);
                        dict.set_item(key, self.value(py, c, inner)?)?;
                    }
                    count = c.count().ok_or_else(miss)?;
                }
                dict.into_any()
            }
            Op::Record(index) => self.record(py, c, *index)?,
        })
    }

    /// `EPOCH + timedelta(microseconds=v)`, UTC: OverflowError outside years 1 to 9999.
    fn datetime<'py>(&self, py: Python<'py>, v: i64) -> PyResult<Bound<'py, PyDateTime>> {
        let days = v.div_euclid(DAY_US);
        if !(MIN_DAYS..=MAX_DAYS).contains(&days) {
            return Err(PyOverflowError::new_err("date value out of range"));
        }
        let (y, m, d) = civil_from_days(days);
        let us = v.rem_euclid(DAY_US);
        let secs = us / 1_000_000;
        PyDateTime::new(
            py,
            y,
            m,
            d,
            (secs / 3_600) as u8,
            (secs / 60 % 60) as u8,
            (secs % 60) as u8,
            (us % 1_000_000) as u32,
            Some(self.utc.bind(py)),
        )
    }
}

/// Strict UTF-8, as `bytes.decode()` (no surrogates, no overlong forms).
fn text(raw: &[u8]) -> PyResult<&str> {
    std::str::from_utf8(raw).map_err(|e| PyValueError::new_err(format!("invalid UTF-8: {e}")))
}

#[pymethods]
impl Reader {
    /// `records`: `_Generator.plan_record`'s `[(class, [(field name, _, operation)], keyword
    /// names)]`, the read record first; `values`: return the first record's field values as a
    /// tuple instead of an instance; `mismatch`: the exception class raised on bytes the
    /// generated reader does not read; `utc`: `datetime.timezone.utc`.
    #[new]
    fn new(
        records: &Bound<'_, PyList>,
        values: bool,
        mismatch: &Bound<'_, PyType>,
        utc: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Reader {
            records: parse_records(records)?,
            values,
            mismatch: mismatch.clone().unbind(),
            utc: utc.downcast::<PyTzInfo>()?.clone().unbind(),
        })
    }

    /// The record whose body is `data[offset:]`, all of it (`Mismatch` on trailing bytes).
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyBytes>,
        offset: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut c = Cursor {
            d: data.as_bytes(),
            p: offset,
        };
        let out = if self.values {
            PyTuple::new(py, self.fields(py, &mut c, 0)?)?.into_any()
        } else {
            self.record(py, &mut c, 0)?
        };
        if c.p != c.d.len() {
            return Err(self.miss(py));
        }
        Ok(out)
    }
}
