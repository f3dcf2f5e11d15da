# Writes core/src/dot/grids_data.rs (run from the repository root): the IQ lattice grids
# as packed component indices, from the gguf package (the same data as ggml-common.h).
import numpy as np, gguf.quants as q
out = ["//! IQ lattice grids for the dot products, generated from the `gguf` Python package's",
       "//! grid data (the same lattices as ggml's `iq*_grid` tables). Entry `i` packs the",
       "//! indices of its components into the grid's value set, component 0 in the lowest bits;",
       "//! `super::iq` expands them at compile time into one `i8` per component (all values fit),",
       "//! the layout of ggml's byte tables.",
       "//!",
       "//! The dequantizer keeps the same data privately in `dequant/grids.rs`; the two are",
       "//! checked against each other through the dot-product tests (dot vs dequantized row).",
       ""]
for name, rname in [('IQ2_XXS','IQ2XXS'),('IQ2_XS','IQ2XS'),('IQ2_S','IQ2S'),('IQ3_XXS','IQ3XXS'),('IQ3_S','IQ3S'),('IQ1_S','IQ1S')]:
    c = getattr(q, name); c.init_grid()
    g = c.grid.reshape(c.grid_shape)
    gm = list(c.grid_map); bits = 2 if len(gm) <= 4 else 3
    packed = []
    for row in g:
        v = 0
        for j, x in enumerate(row):
            v |= gm.index(int(x)) << (bits * j)
        packed.append(v)
    n, comp = c.grid_shape
    out.append(f"/// {name}: {n} entries of {comp} components, {bits} bits each, indices into `{rname}_VALUES`.")
    out.append(f"pub(crate) const {rname}_PACKED: [u16; {n}] = [")
    for i in range(0, n, 12):
        out.append("    " + ", ".join(f"0x{v:04x}" for v in packed[i:i+12]) + ",")
    out.append("];")
    ty = "i8"
    out.append(f"/// Component values of {name}.")
    out.append(f"pub(crate) const {rname}_VALUES: [{ty}; {len(gm)}] = [{', '.join(str(x) for x in gm)}];")
    out.append("")
open('core/src/dot/grids_data.rs','w').write("\n".join(out))
