# What `cmake --install BUILD [--prefix P]` puts in a prefix, for programs built on spindle:
#
#   bin/spindle                                  the server
#   include/spindle/...                          the public headers (include/ only: nothing of src/)
#   lib/libspindle_*.a                           the libraries, one per layer (the gateway's: per room)
#   lib/cmake/spindle/spindleConfig.cmake        find_package(spindle 0.1 CONFIG REQUIRED)
#   lib/pkgconfig/spindle.pc                     pkg-config --cflags --libs spindle
#
# Targets for users: spindle::spindle (runtime, net, HTTP: every layer's library below the
# gateway, which programs may also name alone, e.g. spindle::h1 for the HTTP/1 parser),
# spindle::proxy (the gateway layer: its rooms' libraries), spindle::hook (the opt-in libc
# hooks) and spindle::pg (the PostgreSQL client); the last two bring the runtime alone (a program
# that also serves HTTP names spindle::spindle as well). Versions: while the major version is 0, a
# minor version may change the API, so a request for 0.1 is met by 0.1.x only (SameMinorVersion);
# from 1.0 on, SameMajorVersion.
include(CMakePackageConfigHelpers)

install(TARGETS spindle spindle_base spindle_runtime spindle_http spindle_h1 spindle_h2
                spindle_server spindle_client spindle_handlers spindle_proxy spindle_proxy_config
                spindle_proxy_parts spindle_proxy_request spindle_proxy_gateway spindle_hook spindle_pg
        EXPORT spindleTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS spindle_bin RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/spindle DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT spindleTargets NAMESPACE spindle:: FILE spindleTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spindle)
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_spindle_compatibility SameMinorVersion)
else()
  set(_spindle_compatibility SameMajorVersion)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/spindleConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/spindleConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spindle)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/spindleConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${_spindle_compatibility})
install(FILES ${PROJECT_BINARY_DIR}/spindleConfig.cmake ${PROJECT_BINARY_DIR}/spindleConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spindle)
# spindle.pc finds its prefix from where it lies (${pcfiledir}), so that --prefix at install
# time is honoured: one ".." per component of LIBDIR, and one for pkgconfig/.
string(REGEX REPLACE "[^/]+" ".." SPINDLE_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
configure_file(${PROJECT_SOURCE_DIR}/cmake/spindle.pc.in ${PROJECT_BINARY_DIR}/spindle.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/spindle.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
