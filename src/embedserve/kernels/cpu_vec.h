// What every kernel of this package includes first: ATen's vector types and thread pool,
// compiled for the machine's widest vector ISA.
//
// ATen's vec headers choose their implementation from CPU_CAPABILITY_* macros, which a
// torch build sets per compilation unit; a kernel built outside torch must set them itself
// before including them, or Vectorized<float> silently falls back to scalar code. The
// build passes -march=native, so the compiler's own ISA macros say what this CPU has.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
