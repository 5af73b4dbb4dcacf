//! The plan the writer and the reader are made of (built by cqrs/codec/binary.py,
//! `_Generator.plan_record`, as plain Python tuples): per record class, its fields' operations.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};

/// How to write or read one value.
pub(crate) enum Op {
    Long,
    /// An Avro int: written in its range; read as a long, as the generated reader reads it.
    Int,
    Double,
    Float,
    Str,
    Bytes,
    Bool,
    DateTime,
    Date,
    /// A value of exactly this class, as the string `str(value)`; read as `cls(text)` (UUID,
    /// Decimal).
    StrOf(Py<PyType>),
    /// A member of exactly this enum class: written as its index's varint (the dict), read
    /// from the members in the order of the schema's symbols.
    Enum {
        cls: Py<PyType>,
        index: Py<PyDict>,
        members: Vec<PyObject>,
    },
    /// `None` or the inner value; `null_first`: the union's branch order.
    Optional(bool, Box<Op>),
    /// The items; `true`: read as a tuple (the field's type is a tuple), else a list.
    List(Box<Op>, bool),
    Map(Box<Op>),
    /// An instance of exactly the record at this index of the plan.
    Record(usize),
}

pub(crate) struct Field {
    pub name: Py<PyString>,
    /// the index of the field's value in the values given to a writer's call (top record only)
    pub given: Option<usize>,
    pub op: Op,
}

pub(crate) struct Record {
    pub cls: Py<PyType>,
    pub fields: Vec<Field>,
    /// the names the last fields are passed by when the reader makes the instance (the
    /// constructor takes the first ones by position), as the generated `cls(v0, v1, name2=v2)`
    pub keywords: Vec<Py<PyString>>,
}

/// The plan's records: `[(class, [(field name, given index or None, operation)], keyword
/// names)]`, the written or read record first.
pub(crate) fn parse_records(records: &Bound<'_, PyList>) -> PyResult<Vec<Record>> {
    let py = records.py();
    let mut parsed = Vec::with_capacity(records.len());
    for rec in records.iter() {
        let rec = rec.downcast::<PyTuple>()?;
        let cls = rec.get_item(0)?.downcast::<PyType>()?.clone().unbind();
        let mut fields = Vec::new();
        for f in rec.get_item(1)?.downcast::<PyList>()?.iter() {
            let f = f.downcast::<PyTuple>()?;
            let given_obj = f.get_item(1)?;
            fields.push(Field {
                name: PyString::intern(py, f.get_item(0)?.downcast::<PyString>()?.to_str()?)
                    .unbind(),
                given: if given_obj.is_none() {
                    None
                } else {
                    Some(given_obj.extract()?)
                },
                op: parse_op(&f.get_item(2)?)?,
            });
        }
        let mut keywords = Vec::new();
        for name in rec.get_item(2)?.downcast::<PyTuple>()?.iter() {
            keywords.push(PyString::intern(py, name.downcast::<PyString>()?.to_str()?).unbind());
        }
        if keywords.len() > fields.len() {
            return Err(PyValueError::new_err("more keyword names than fields"));
        }
        parsed.push(Record {
            cls,
            fields,
            keywords,
        });
    }
    if parsed.is_empty() {
        return Err(PyValueError::new_err("a plan needs at least one record"));
    }
    for rec in &parsed {
        for f in &rec.fields {
            check_indices(&f.op, parsed.len())?;
        }
    }
    Ok(parsed)
}

fn parse_op(plan: &Bound<'_, PyAny>) -> PyResult<Op> {
    let t = plan.downcast::<PyTuple>()?;
    let kind_obj = t.get_item(0)?;
    let kind = kind_obj.downcast::<PyString>()?.to_str()?;
    Ok(match kind {
        "long" => Op::Long,
        "int" => Op::Int,
        "double" => Op::Double,
        "float" => Op::Float,
        "str" => Op::Str,
        "bytes" => Op::Bytes,
        "bool" => Op::Bool,
        "datetime" => Op::DateTime,
        "date" => Op::Date,
        "strof" => Op::StrOf(t.get_item(1)?.downcast::<PyType>()?.clone().unbind()),
        // ("enum", class, the writer's index, the members in the symbols' order)
        "enum" => Op::Enum {
            cls: t.get_item(1)?.downcast::<PyType>()?.clone().unbind(),
            index: t.get_item(2)?.downcast::<PyDict>()?.clone().unbind(),
            members: t
                .get_item(3)?
                .downcast::<PyTuple>()?
                .iter()
                .map(Bound::unbind)
                .collect(),
        },
        "optional" => Op::Optional(
            t.get_item(1)?.is_truthy()?,
            Box::new(parse_op(&t.get_item(2)?)?),
        ),
        "list" => Op::List(
            Box::new(parse_op(&t.get_item(1)?)?),
            t.get_item(2)?.is_truthy()?,
        ),
        "map" => Op::Map(Box::new(parse_op(&t.get_item(1)?)?)),
        "record" => Op::Record(t.get_item(1)?.extract()?),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown plan operation {other:?}"
            )))
        }
    })
}

fn check_indices(op: &Op, count: usize) -> PyResult<()> {
    match op {
        Op::Record(i) if *i >= count => {
            Err(PyValueError::new_err(format!("no record {i} in the plan")))
        }
        Op::Optional(_, inner) | Op::List(inner, _) | Op::Map(inner) => check_indices(inner, count),
        _ => Ok(()),
    }
}
