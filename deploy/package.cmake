# The Debian packages, made by `cpack -G DEB` in a build tree (deploy/package.sh does it all):
#   traind       the programs (portable: kernels chosen at run time, no -march=native), the
#                dashboard, the systemd unit, /etc/traind/traind.json, man pages, the API
#                description and the examples; Depends computed from the shared libraries
#                (dpkg-shlibdeps) plus the chart library's package
#   traind-cuda  the CUDA backend (libtraind_gpu.so), so CPU-only nodes install no CUDA
# Install components name what goes where: traind, cuda.
include(GNUInstallDirs)

# ---- what an install holds, beyond the programs' own rules ----------------------------------

# man pages from each program's --help (help2man), gzipped as Debian wants them
find_program(HELP2MAN help2man)
find_program(GZIP gzip)
if(HELP2MAN AND GZIP)
  set(TRAIND_MAN_NAMES
    "traind=distributed deep-learning training daemon"
    "traind-run=torchrun-style launcher of a process group"
    "traind-worker=trains one rank of a traind job spec")
  set(TRAIND_MAN_PAGES)
  foreach(entry IN LISTS TRAIND_MAN_NAMES)
    string(REPLACE "=" ";" parts "${entry}")
    list(GET parts 0 prog)
    list(GET parts 1 what)
    set(page ${CMAKE_BINARY_DIR}/man/${prog}.1)
    add_custom_command(OUTPUT ${page}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${HELP2MAN} --no-info --no-discard-stderr --name "${what}" --output ${page}
              $<TARGET_FILE:${prog}>
      COMMAND ${GZIP} -9nf ${page}
      DEPENDS ${prog} VERBATIM)
    list(APPEND TRAIND_MAN_PAGES ${page}.gz)
  endforeach()
  add_custom_target(man-pages ALL DEPENDS ${TRAIND_MAN_PAGES})
  install(FILES ${TRAIND_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT traind)
endif()

# the unit where Debian 12's systemd reads packaged units, the default config as a conffile
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/traind.service
  DESTINATION /lib/systemd/system COMPONENT traind)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/traind.json DESTINATION /etc/traind COMPONENT traind)
set(TRAIND_DOC ${CMAKE_INSTALL_DATADIR}/doc/traind)
install(FILES ${PROJECT_SOURCE_DIR}/api/openapi.json DESTINATION ${TRAIND_DOC} COMPONENT traind)
install(FILES ${PROJECT_SOURCE_DIR}/api/README.md DESTINATION ${TRAIND_DOC} RENAME api.md
  COMPONENT traind)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/deploy/debian/copyright
  DESTINATION ${TRAIND_DOC} COMPONENT traind)
# the pages the README links to (docs/settings.md among them), beside it as in the source tree
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${TRAIND_DOC}/docs COMPONENT traind
  FILES_MATCHING PATTERN "*.md")
# Debian's changelog, gzipped (a native package's is changelog.gz)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/changelog.gz
  COMMAND ${GZIP} -9nc ${PROJECT_SOURCE_DIR}/deploy/debian/changelog > ${CMAKE_BINARY_DIR}/changelog.gz
  DEPENDS ${PROJECT_SOURCE_DIR}/deploy/debian/changelog)
add_custom_target(debian-changelog ALL DEPENDS ${CMAKE_BINARY_DIR}/changelog.gz)
install(FILES ${CMAKE_BINARY_DIR}/changelog.gz DESTINATION ${TRAIND_DOC} COMPONENT traind)
if(TRAIND_HAVE_CUDA) # every package carries its own copyright and changelog
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${CMAKE_BINARY_DIR}/changelog.gz
    DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/traind-cuda COMPONENT cuda)
endif()

# The Python client, where Debian's python3 finds modules: a package of its own
# (python3-traind-client), for machines that only submit jobs
install(DIRECTORY ${PROJECT_SOURCE_DIR}/clients/python/traind_client
  DESTINATION lib/python3/dist-packages COMPONENT python FILES_MATCHING PATTERN "*.py")
install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${CMAKE_BINARY_DIR}/changelog.gz
  DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/python3-traind-client COMPONENT python)

# ---- CPack -----------------------------------------------------------------------------------

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL traind python)
if(TRAIND_HAVE_CUDA)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
set(CPACK_PACKAGE_NAME traind)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# .invalid (RFC 2606): the project has no mail domain yet; a distributor sets their own
set(TRAIND_PACKAGE_MAINTAINER "traind developers <maintainers@traind.invalid>" CACHE STRING
  "The Maintainer field of the .deb packages")
set(CPACK_PACKAGE_CONTACT "${TRAIND_PACKAGE_MAINTAINER}")
# stripped, as Debian wants binaries (lintian: unstripped-binary-or-object)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # traind_VERSION_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_RELEASE "")
# the traind package
set(CPACK_DEBIAN_TRAIND_PACKAGE_NAME traind)
set(CPACK_DEBIAN_TRAIND_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_TRAIND_PACKAGE_DEPENDS "libjs-dygraphs")
set(CPACK_DEBIAN_TRAIND_PACKAGE_SUGGESTS "traind-cuda, python3-torch")
# (CPack indents the lines after the first itself; each under 80 columns)
set(CPACK_COMPONENT_TRAIND_DESCRIPTION "distributed deep-learning training service
traind runs on every GPU server: users submit JSON jobs over HTTP (curl,
trainctl, the web dashboard), the master places them on nodes and GPUs, and
each node starts one process per GPU with the torchrun environment. It trains
data-parallel models itself (traind-worker) or runs unmodified PyTorch DDP
scripts, streams their metrics, stores checkpoints, writes TensorBoard event
files and serves Prometheus metrics. This package holds the CPU programs, the
dashboard and the systemd unit.")
set(CPACK_DEBIAN_TRAIND_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/deploy/debian/postinst ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
  ${PROJECT_SOURCE_DIR}/deploy/debian/postrm ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_TRAIND_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# the traind-cuda package: its CUDA libraries (cuBLAS, cuDNN 9, NCCL 2) come from NVIDIA's
# repository, which dpkg-shlibdeps cannot map to packages and would stop at; its Debian ones
# (libc6, libstdc++6, libgcc-s1) are computed at cpack time by deploy/package-config.cmake,
# with the missing ones ignored
set(CPACK_DEBIAN_CUDA_PACKAGE_NAME traind-cuda)
set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "traind (= ${PROJECT_VERSION})")
set(TRAIND_GPU_LIBRARY_FILE ${CMAKE_BINARY_DIR}/libtraind_gpu.so)
configure_file(${PROJECT_SOURCE_DIR}/deploy/package-config.cmake.in
  ${CMAKE_BINARY_DIR}/package-config.cmake @ONLY)
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_BINARY_DIR}/package-config.cmake)
set(CPACK_COMPONENT_CUDA_DESCRIPTION "GPU backend of the traind training service
libtraind_gpu.so: traind-worker's CUDA kernels and its cuBLAS, cuDNN and NCCL
calls, loaded only by GPU jobs. It needs the NVIDIA driver and the CUDA 13
runtime libraries (cuBLAS, cuDNN 9, NCCL 2) on the library path, as NVIDIA's
repository installs them.")
# the python3-traind-client package: pure Python, the standard library alone
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-traind-client)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3 (>= 3.9)")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "Python client of the traind training service
traind_client: submit jobs to a traind daemon over its HTTP API v1, follow
their events (resuming a dropped stream), read metrics and logs, download
checkpoints, cancel and delete jobs. Standard library only.")
include(CPack)
