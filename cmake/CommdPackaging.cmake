# Install layout of the SDK (library, public headers, generated message headers, CMake
# package config, pkg-config file) and the Debian package CPack builds from every install
# rule: `cpack -G DEB` in the build dir (after the build) writes commd_<version>_<arch>.deb.
# The daemon's own files (unit, config, rules, dashboards) are installed by deploy/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS commd_client LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Unspecified)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/commd DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
# The vocabulary the public headers re-export lives below the SDK (common/include/commd/).
install(FILES ${PROJECT_SOURCE_DIR}/common/include/commd/vocabulary.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/commd)
# The SDK's headers include the commd.v1 messages it returns; only the .pb.h files, the gRPC
# stubs stay private to the library.
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto_gen/commd/v1 DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/commd
        FILES_MATCHING PATTERN "*.pb.h" PATTERN "*.grpc.pb.h" EXCLUDE)

set(COMMD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/commd)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/commdConfig.cmake.in
  ${PROJECT_BINARY_DIR}/commdConfig.cmake INSTALL_DESTINATION ${COMMD_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/commdConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/commdConfig.cmake ${PROJECT_BINARY_DIR}/commdConfigVersion.cmake
        DESTINATION ${COMMD_CMAKE_DIR})
# The .pc file finds its prefix from its own place, so an unpacked tree works as well as /usr.
file(RELATIVE_PATH COMMD_PC_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
configure_file(${PROJECT_SOURCE_DIR}/cmake/commd.pc.in ${PROJECT_BINARY_DIR}/commd.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/commd.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

set(CPACK_PACKAGE_NAME commd)
set(CPACK_PACKAGE_VENDOR "commd")
set(CPACK_PACKAGE_CONTACT "commd maintainers <commd@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "${PROJECT_DESCRIPTION}
 commd is a per-node communication daemon for GPU training clusters: it owns the node's
 communication memory, runs rendezvous, keeps a flight recorder of every collective,
 detects hangs and NaNs, and exports Prometheus metrics. This package holds the daemon
 (systemd unit, not enabled), commctl, the client SDK (library, headers, CMake and
 pkg-config files), the default config, Grafana dashboards and Prometheus alert rules.")
# Runtime libraries from the binaries' ELF needs; the SDK's headers need these -dev ones.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "passwd")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libprotobuf-dev, libabsl-dev, prometheus, grafana")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
  ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
  ${PROJECT_SOURCE_DIR}/deploy/debian/postrm
  ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
