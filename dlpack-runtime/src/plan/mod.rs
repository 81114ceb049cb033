//! Pure decisions, no memory touched and no driver called: the `stream` argument parsed per
//! device and the synchronization an exchange needs (`stream`), and strided copies planned as
//! 2-D blocks (`copy`), shared by the host and CUDA copy engines; the fields of the CUDA Array
//! Interface checked and written (`cai`).

pub(crate) mod cai;
pub(crate) mod copy;
pub(crate) mod stream;
