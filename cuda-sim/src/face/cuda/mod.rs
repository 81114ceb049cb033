//! The CUDA face: the `cu*` entry points of the driver API, over the model.

mod api;
mod driver;
mod kernel;
mod peer;
mod stubs;
