//! Gives the shared library the driver's SONAME, as the real `libcuda.so.1` has.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
