# Writes the default config text into a C++ source (run at build time by CMake -P).
file(READ ${INPUT} text)
file(WRITE ${OUTPUT} "// Generated from deploy/commd.textproto; do not edit.\n"
  "namespace commd::config {\nextern const char kEmbeddedDefaultConfig[];\n"
  "const char kEmbeddedDefaultConfig[] = R\"commd_config(${text})commd_config\";\n}\n")
