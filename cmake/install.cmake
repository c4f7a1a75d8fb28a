# install.cmake: what `cmake --install` puts where (GNUInstallDirs layout).
#
#   include/engine.h
#   lib/libengine.a, lib/libengine.so.0.1.0 (+ .so.0, .so links)
#   bin/infer, bin/tokenize, bin/quantize, bin/perplexity, bin/trace_svg (the tools, linked statically)
#   lib/pkgconfig/engine.pc          shared: pkg-config --cflags --libs engine
#   lib/pkgconfig/engine-static.pc   static: pkg-config --cflags --libs engine-static
#   lib/cmake/engine/                find_package(engine CONFIG [COMPONENTS static])
#
# Both package descriptions are relocatable: engine.pc finds its prefix from
# its own folder (${pcfiledir}), engineConfig.cmake from its own path, so
# `cmake --install build --prefix DIR` works for any DIR.
include(CMakePackageConfigHelpers)

set_target_properties(engine_shared PROPERTIES EXPORT_NAME engine_shared)
set_target_properties(engine_static PROPERTIES EXPORT_NAME engine_static)

install(FILES ${PROJECT_SOURCE_DIR}/include/engine.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS engine_shared EXPORT engineSharedTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS engine_static EXPORT engineStaticTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

# Tools defined before this file is included; quantize arrives with quantization.
set(ENGINE_INSTALL_TOOLS "")
foreach(tool infer tokenize quantize perplexity trace_svg)
  if(TARGET ${tool})
    list(APPEND ENGINE_INSTALL_TOOLS ${tool})
  endif()
endforeach()
install(TARGETS ${ENGINE_INSTALL_TOOLS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# ------------------------------------------------------------- pkg-config
# What a static link needs besides the three pkg-config dependencies: the
# OpenMP runtime, libm, threads and, with the CUDA backend, the static CUDA
# runtime (which needs libdl and librt), cuBLASLt and the C++ runtime.
set(ENGINE_PC_DEP_LIBS "${OpenMP_C_FLAGS} -lm -pthread")
if(ENGINE_CUDA)
  string(APPEND ENGINE_PC_DEP_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lcublasLt -ldl -lrt -lstdc++")
endif()
set(ENGINE_PC_DEP_MODULES "jansson libpcre2-8 libutf8proc")

foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(ENGINE_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(ENGINE_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
# From lib/pkgconfig (or lib/x86_64-linux-gnu/pkgconfig) back up to the prefix.
file(RELATIVE_PATH ENGINE_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" ENGINE_PC_TO_PREFIX "${ENGINE_PC_TO_PREFIX}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(ENGINE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  set(ENGINE_PC_PREFIX "\${pcfiledir}/${ENGINE_PC_TO_PREFIX}")
endif()

# engine.pc: the shared library; --static adds what libengine.a needs.
set(ENGINE_PC_NAME "engine")
set(ENGINE_PC_CFLAGS "-I\${includedir}")
set(ENGINE_PC_LIBS "-L\${libdir} -lengine")
set(ENGINE_PC_REQUIRES "")
set(ENGINE_PC_REQUIRES_PRIVATE "${ENGINE_PC_DEP_MODULES}")
set(ENGINE_PC_LIBS_PRIVATE "${ENGINE_PC_DEP_LIBS}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/engine.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/engine.pc @ONLY)
# engine-static.pc: the archive by path (a -lengine would pick the .so), with
# its dependencies public, so a plain --libs links.
set(ENGINE_PC_NAME "engine-static")
set(ENGINE_PC_CFLAGS "-I\${includedir} -DENGINE_STATIC")
set(ENGINE_PC_LIBS "\${libdir}/libengine.a ${ENGINE_PC_DEP_LIBS}")
set(ENGINE_PC_REQUIRES "${ENGINE_PC_DEP_MODULES}")
set(ENGINE_PC_REQUIRES_PRIVATE "")
set(ENGINE_PC_LIBS_PRIVATE "")
configure_file(${PROJECT_SOURCE_DIR}/cmake/engine.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/engine-static.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/engine.pc ${PROJECT_BINARY_DIR}/pkgconfig/engine-static.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---------------------------------------------------------- CMake package
set(ENGINE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/engine)
install(EXPORT engineSharedTargets NAMESPACE engine:: DESTINATION ${ENGINE_CMAKE_DIR})
install(EXPORT engineStaticTargets NAMESPACE engine:: DESTINATION ${ENGINE_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/engineConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/engineConfig.cmake INSTALL_DESTINATION ${ENGINE_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/engineConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/engineConfig.cmake ${PROJECT_BINARY_DIR}/cmake/engineConfigVersion.cmake
  DESTINATION ${ENGINE_CMAKE_DIR})
