// The spindle binary: `spindle serve` runs the HTTP server (embedded default site unless a
// config says otherwise); `spindle check-config FILE`; `spindle upgrade --handover PATH`;
// `spindle --version`; `spindle --help`.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <string>

#include "serve.h"

int main(int argc, char** argv) {
  CLI::App app{"spindle: a fiber-based HTTP server", "spindle"};
  app.set_version_flag("--version", std::string("spindle ") + spindle::app::kVersion);
  app.require_subcommand(1);

  spindle::app::ServeFlags flags;
  auto* serve = app.add_subcommand("serve", "serve HTTP (embedded default site unless --config)");
  serve->add_option("--config", flags.config, "YAML configuration file")->check(CLI::ExistingFile);
  serve->add_option("--listen", flags.listen, "address to listen on, e.g. 127.0.0.1:8080");
  serve->add_option("--threads", flags.threads, "worker threads (0: one per core)")
      ->check(CLI::Range(0, 1024));
  serve->add_option("--root", flags.root, "serve static files from this directory")
      ->check(CLI::ExistingDirectory);

  serve->add_option("--handover", flags.handover,
                    "Unix socket for zero-downtime upgrades: take the listening sockets of the "
                    "spindle serving there, then serve there for the next one");

  std::string upgrade_socket;
  auto* upgrade = app.add_subcommand(
      "upgrade", "start a new spindle that takes over from the one serving with --handover");
  upgrade->add_option("--handover", upgrade_socket, "its --handover socket")->required();

  std::string check_file;
  auto* check = app.add_subcommand("check-config", "validate a configuration file and exit");
  check->add_option("file", check_file, "YAML configuration file")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (*check) return spindle::app::check_config(check_file);
  if (*upgrade) return spindle::app::upgrade(upgrade_socket);
  flags.argv.assign(argv, argv + argc);
  return spindle::app::serve(flags);
}
