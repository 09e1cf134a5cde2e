"""Native CPU kernels: C++ sources built on first use for the machine they run on."""
