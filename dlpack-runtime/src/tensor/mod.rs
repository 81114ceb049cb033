//! What a tensor is: element types (`dtype`), devices and what each device allows (`device`),
//! layouts and their validation (`layout`), and owned DLPack tensors (`managed`).

pub(crate) mod device;
pub(crate) mod dtype;
pub(crate) mod layout;
pub(crate) mod managed;
