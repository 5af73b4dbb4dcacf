//! Instances of frozen attrs classes made without their `__init__` (used by cqrs/native.py,
//! `builder`): a frozen class's `__init__` sets each field through `object.__setattr__`
//! (~60 ns a field), and the per-command path makes several such objects a command.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};

/// `Builder(cls, names, defaults)`: `builder(*values)` is the instance of `cls` whose fields
/// `names` hold `values`, in order, and whose other fields hold `defaults` (pairs of name and
/// value), as `cls(*values)` makes it. The Python side only makes builders of classes whose
/// `__init__` does nothing else (no validator, converter, factory or post-init hook).
#[pyclass(frozen, module = "cqrs_native")]
pub struct Builder {
    cls: Py<PyType>,
    names: Vec<Py<PyString>>,
    defaults: Vec<(Py<PyString>, PyObject)>,
}

#[pymethods]
impl Builder {
    #[new]
    fn new(
        cls: &Bound<'_, PyType>,
        names: Vec<String>,
        defaults: Vec<(String, PyObject)>,
    ) -> PyResult<Self> {
        let py = cls.py();
        Ok(Builder {
            cls: cls.clone().unbind(),
            names: names
                .iter()
                .map(|n| PyString::intern(py, n).unbind())
                .collect(),
            defaults: defaults
                .into_iter()
                .map(|(n, v)| (PyString::intern(py, &n).unbind(), v))
                .collect(),
        })
    }

    #[pyo3(signature = (*values))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if values.len() != self.names.len() {
            return Err(PyTypeError::new_err(format!(
                "{} takes {} values, got {}",
                self.cls.bind(py).qualname()?,
                self.names.len(),
                values.len()
            )));
        }
        let cls = self.cls.bind(py);
        // object.__new__(cls): the type's allocation, as object_new does it
        let obj = unsafe {
            let tp = cls.as_type_ptr();
            let alloc = (*tp)
                .tp_alloc
                .ok_or_else(|| PyValueError::new_err("a type without tp_alloc"))?;
            let raw = alloc(tp, 0);
            if raw.is_null() {
                return Err(PyErr::fetch(py));
            }
            Bound::from_owned_ptr(py, raw)
        };
        for (name, value) in self.names.iter().zip(values.iter()) {
            set(&obj, name.bind(py), &value)?;
        }
        for (name, value) in &self.defaults {
            set(&obj, name.bind(py), value.bind(py))?;
        }
        Ok(obj)
    }
}

/// `object.__setattr__(obj, name, value)`: past a frozen class's `__setattr__`, as its
/// `__init__` does.
fn set(
    obj: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let rc =
        unsafe { pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if rc < 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(())
}
