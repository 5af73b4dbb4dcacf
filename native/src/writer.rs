//! The codec's native writer (used by cqrs/codec/binary.py, record_writer).
//!
//! `record_writer` walks a class's attrs fields and its Avro schema together and describes how
//! to write each field as a small tree of operations (the plan: plain Python tuples, see
//! `_Generator.plan_record`). A `Writer` made of it writes an instance as the generated Python
//! writer does: the same bytes (fastavro's), the same exact-type guards, and `Mismatch` (the
//! class given to it) on any value those guards refuse, so that the codec falls back to the
//! path that names the offending field.

use pyo3::prelude::*;

use crate::plan::{parse_records, Op, Record};
use pyo3::types::{
    PyBool, PyBytes, PyDate, PyDateAccess, PyDateTime, PyDelta, PyDeltaAccess, PyDict, PyFloat,
    PyInt, PyList, PyString, PyTimeAccess, PyTuple, PyType, PyTzInfoAccess,
};

/// `Writer(prefix, records, mismatch, utc)`: `writer(obj)` (or `writer(obj, values)`) returns
/// `prefix` + the Avro body of `obj`, an instance of the first record.
#[pyclass(frozen, module = "cqrs_native")]
pub struct Writer {
    prefix: Vec<u8>,
    records: Vec<Record>,
    mismatch: Py<PyType>,
    utc: PyObject,
}

#[inline]
pub(crate) fn zigzag(buf: &mut Vec<u8>, v: i64) {
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    while n >= 0x80 {
        buf.push((n as u8) | 0x80);
        n >>= 7;
    }
    buf.push(n as u8);
}

#[inline]
fn length(buf: &mut Vec<u8>, n: usize) {
    zigzag(buf, n as i64);
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian).
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl Writer {
    fn miss(&self, py: Python<'_>) -> PyErr {
        PyErr::from_type(self.mismatch.bind(py).clone(), ())
    }

    fn record(
        &self,
        py: Python<'_>,
        buf: &mut Vec<u8>,
        index: usize,
        obj: &Bound<'_, PyAny>,
        values: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        for field in &self.records[index].fields {
            let value = match (field.given, values) {
                (Some(i), Some(given)) => given.get_item(i)?,
                _ => obj.getattr(field.name.bind(py))?,
            };
            self.value(py, buf, &field.op, &value)?;
        }
        Ok(())
    }

    fn value(
        &self,
        py: Python<'_>,
        buf: &mut Vec<u8>,
        op: &Op,
        x: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        match op {
            Op::Long => {
                if !x.is_exact_instance_of::<PyInt>() {
                    return Err(self.miss(py));
                }
                let v: i64 = x.extract().map_err(|_| self.miss(py))?;
                zigzag(buf, v);
            }
            Op::Int => {
                if !x.is_exact_instance_of::<PyInt>() {
                    return Err(self.miss(py));
                }
                let v: i32 = x.extract().map_err(|_| self.miss(py))?;
                zigzag(buf, v as i64);
            }
            Op::Double | Op::Float => {
                let v: f64 = if x.is_exact_instance_of::<PyFloat>() {
                    x.downcast::<PyFloat>()?.value()
                } else if x.is_exact_instance_of::<PyInt>() {
                    x.extract()? // float(x): OverflowError for a huge int, as Python's
                } else {
                    return Err(self.miss(py));
                };
                if let Op::Double = op {
                    buf.extend_from_slice(&v.to_le_bytes());
                } else {
                    let f = v as f32;
                    if f.is_infinite() && v.is_finite() {
                        return Err(self.miss(py)); // struct.pack("<f") raises OverflowError
                    }
                    buf.extend_from_slice(&f.to_le_bytes());
                }
            }
            Op::Str => {
                if !x.is_exact_instance_of::<PyString>() {
                    return Err(self.miss(py));
                }
                let s = x.downcast::<PyString>()?.to_str()?; // surrogates: UnicodeEncodeError
                length(buf, s.len());
                buf.extend_from_slice(s.as_bytes());
            }
            Op::Bytes => {
                if !x.is_exact_instance_of::<PyBytes>() {
                    return Err(self.miss(py));
                }
                let b = x.downcast::<PyBytes>()?.as_bytes();
                length(buf, b.len());
                buf.extend_from_slice(b);
            }
            Op::Bool => {
                if !x.is_exact_instance_of::<PyBool>() {
                    return Err(self.miss(py));
                }
                buf.push(if x.downcast::<PyBool>()?.is_true() {
                    1
                } else {
                    0
                });
            }
            Op::DateTime => {
                if !x.is_exact_instance_of::<PyDateTime>() {
                    return Err(self.miss(py));
                }
                let dt = x.downcast::<PyDateTime>()?;
                let offset_us: i64 = match dt.get_tzinfo() {
                    None => return Err(self.miss(py)),
                    Some(tz) if tz.is(self.utc.bind(py)) => 0,
                    Some(_) => {
                        let offset = x.call_method0(pyo3::intern!(py, "utcoffset"))?;
                        if offset.is_none() {
                            return Err(self.miss(py));
                        }
                        let d = offset.downcast::<PyDelta>()?;
                        (d.get_days() as i64 * 86_400 + d.get_seconds() as i64) * 1_000_000
                            + d.get_microseconds() as i64
                    }
                };
                let days = days_from_civil(
                    dt.get_year() as i64,
                    dt.get_month() as i64,
                    dt.get_day() as i64,
                );
                let secs = days * 86_400
                    + dt.get_hour() as i64 * 3_600
                    + dt.get_minute() as i64 * 60
                    + dt.get_second() as i64;
                zigzag(
                    buf,
                    secs * 1_000_000 + dt.get_microsecond() as i64 - offset_us,
                );
            }
            Op::Date => {
                if !x.is_exact_instance_of::<PyDate>() {
                    return Err(self.miss(py));
                }
                let d = x.downcast::<PyDate>()?;
                zigzag(
                    buf,
                    days_from_civil(
                        d.get_year() as i64,
                        d.get_month() as i64,
                        d.get_day() as i64,
                    ),
                );
            }
            Op::StrOf(cls) => {
                if !x.get_type().is(cls.bind(py)) {
                    return Err(self.miss(py));
                }
                let text = x.str()?;
                let s = text.to_str()?;
                length(buf, s.len());
                buf.extend_from_slice(s.as_bytes());
            }
            Op::Enum { cls, index, .. } => {
                if !x.get_type().is(cls.bind(py)) {
                    return Err(self.miss(py));
                }
                match index.bind(py).get_item(x)? {
                    Some(b) => buf.extend_from_slice(b.downcast::<PyBytes>()?.as_bytes()),
                    None => return Err(self.miss(py)),
                }
            }
            Op::Optional(null_first, inner) => {
                if x.is_none() {
                    buf.push(if *null_first { 0 } else { 2 });
                } else {
                    buf.push(if *null_first { 2 } else { 0 });
                    self.value(py, buf, inner, x)?;
                }
            }
            Op::List(inner, _) => {
                if let Ok(list) = x.downcast_exact::<PyList>() {
                    if !list.is_empty() {
                        length(buf, list.len());
                        for item in list.iter() {
                            self.value(py, buf, inner, &item)?;
                        }
                    }
                } else if let Ok(tuple) = x.downcast_exact::<PyTuple>() {
                    if !tuple.is_empty() {
                        length(buf, tuple.len());
                        for item in tuple.iter() {
                            self.value(py, buf, inner, &item)?;
                        }
                    }
                } else {
                    return Err(self.miss(py));
                }
                buf.push(0);
            }
            Op::Map(inner) => {
                let Ok(dict) = x.downcast_exact::<PyDict>() else {
                    return Err(self.miss(py));
                };
                if !dict.is_empty() {
                    length(buf, dict.len());
                    for (k, v) in dict.iter() {
                        if !k.is_exact_instance_of::<PyString>() {
                            return Err(self.miss(py));
                        }
                        let s = k.downcast::<PyString>()?.to_str()?;
                        length(buf, s.len());
                        buf.extend_from_slice(s.as_bytes());
                        self.value(py, buf, inner, &v)?;
                    }
                }
                buf.push(0);
            }
            Op::Record(index) => {
                if !x.get_type().is(self.records[*index].cls.bind(py)) {
                    return Err(self.miss(py));
                }
                self.record(py, buf, *index, x, None)?;
            }
        }
        Ok(())
    }
}

#[pymethods]
impl Writer {
    /// `records`: the plan (see plan.rs), the written record first; `mismatch`: the exception class raised on a value the guards
    /// refuse; `utc`: `datetime.timezone.utc`.
    #[new]
    fn new(
        prefix: &[u8],
        records: &Bound<'_, PyList>,
        mismatch: &Bound<'_, PyType>,
        utc: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Writer {
            prefix: prefix.to_vec(),
            records: parse_records(records)?,
            mismatch: mismatch.clone().unbind(),
            utc: utc.clone().unbind(),
        })
    }

    #[pyo3(signature = (obj, values=None))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        obj: &Bound<'py, PyAny>,
        values: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf: Vec<u8> = Vec::with_capacity(self.prefix.len() + 120);
        buf.extend_from_slice(&self.prefix);
        self.record(py, &mut buf, 0, obj, values)?;
        Ok(PyBytes::new(py, &buf))
    }
}
