/* libkdtree.so is kdtree_core linked whole; this file gives the target a source. */
