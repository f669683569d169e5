# Cython declarations of the fastbus C core, one .pxd per C header:
#   from fastbus.includes.fb_trie cimport fb_trie, fb_trie_match
# Compile against fastbus.get_include() and link fastbus.get_library_dirs()/fastbus.
