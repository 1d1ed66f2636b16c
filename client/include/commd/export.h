// COMMD_API marks what the shared library exports; everything else stays hidden.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_EXPORT_H_
#define COMMD_CLIENT_INCLUDE_COMMD_EXPORT_H_

#define COMMD_API __attribute__((visibility("default")))

#endif  // COMMD_CLIENT_INCLUDE_COMMD_EXPORT_H_
