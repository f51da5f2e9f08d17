/**
 * The extension's commands. The sidebar's buttons run these too, so each action
 * (confirm and shut down, insert attach code, open the dashboard) lives in one place.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { refreshIcon } from '@jupyterlab/ui-components';

import { errorMessage, ICluster } from './api';
import { usd, usdPerHour } from './format';
import { gpuIcon } from './icons';
import { ClustersModel } from './model';
import { SIDEBAR_ID } from './sidebar';

export namespace CommandIDs {
  export const openSidebar = 'gpugeek:open-sidebar';
  export const refresh = 'gpugeek:refresh';
  export const shutdown = 'gpugeek:shutdown';
  export const insertAttachCode = 'gpugeek:insert-attach-code';
  export const openDashboard = 'gpugeek:open-dashboard';
}

const CATEGORY = 'GPU Geek';

export interface ICommandsOptions {
  app: JupyterFrontEnd;
  model: ClustersModel;
  notebooks: INotebookTracker | null;
  palette: ICommandPalette | null;
}

/** Registers the commands and puts them in the palette (when there is one). */
export function addCommands(options: ICommandsOptions): void {
  const { app, model, notebooks, palette } = options;
  const { commands, shell } = app;

  commands.addCommand(CommandIDs.openSidebar, {
    label: 'Show GPU clusters',
    caption: 'Open the GPU clusters sidebar',
    icon: args => (args.isPalette ? undefined : gpuIcon),
    execute: () => shell.activateById(SIDEBAR_ID)
  });

  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh GPU clusters',
    icon: args => (args.isPalette ? undefined : refreshIcon),
    execute: () => model.refresh()
  });

  commands.addCommand(CommandIDs.shutdown, {
    label: args => (args.name ? `Shut down GPU cluster ${args.name}` : 'Shut down a GPU cluster…'),
    caption: 'Stop a live cluster and every node it is billed for',
    execute: async args => {
      const cluster = await Private.resolve(model, args.name, 'Shut down which GPU cluster?');
      if (cluster) {
        await Private.shutdown(model, cluster);
      }
    }
  });

  commands.addCommand(CommandIDs.insertAttachCode, {
    label: args =>
      args.name ? `Insert attach code for ${args.name}` : 'Insert GPU cluster attach code…',
    caption: 'Insert a cell below the active one that attaches the kernel to a cluster',
    execute: async args => {
      const panel = notebooks?.currentWidget ?? null;
      if (!panel) {
        Notification.warning(
          'Open a notebook first: the attach code goes in a new cell below its active cell.',
          { autoClose: 6000 }
        );
        return;
      }
      const cluster = await Private.resolve(
        model,
        args.name,
        'Attach the notebook to which cluster?'
      );
      if (!cluster) {
        return;
      }
      const notebook = panel.content;
      const cells = notebook.model?.sharedModel;
      if (!cells) {
        return;
      }
      const index = notebook.activeCell ? notebook.activeCellIndex + 1 : cells.cells.length;
      cells.insertCell(index, { cell_type: 'code', source: cluster.attach_code, metadata: {} });
      notebook.activeCellIndex = index;
      notebook.mode = 'command';
      shell.activateById(panel.id);
      Notification.info(`Attach code for ${cluster.name} inserted: run the cell to attach.`, {
        autoClose: 4000
      });
    }
  });

  commands.addCommand(CommandIDs.openDashboard, {
    label: args => (args.name ? `Open Ray dashboard of ${args.name}` : 'Open a Ray dashboard…'),
    caption: "Open a cluster's Ray dashboard in a new browser tab",
    execute: async args => {
      const cluster = await Private.resolve(
        model,
        args.name,
        'Open the dashboard of which cluster?'
      );
      if (!cluster) {
        return;
      }
      if (!cluster.dashboard_url) {
        Notification.warning(`${cluster.name} was started without Ray's dashboard.`, {
          autoClose: 6000
        });
        return;
      }
      window.open(cluster.dashboard_url, '_blank', 'noopener');
    }
  });

  if (palette) {
    for (const command of Object.values(CommandIDs)) {
      palette.addItem({ command, category: CATEGORY });
    }
  }
}

namespace Private {
  /**
   * The cluster a command is about: its `name` argument, or else the only live cluster,
   * or else the one the user picks. Null (after telling the user why) when none.
   */
  export async function resolve(
    model: ClustersModel,
    nameArg: unknown,
    question: string
  ): Promise<ICluster | null> {
    const name = typeof nameArg === 'string' ? nameArg : '';
    if (name) {
      const known = model.find(name);
      if (known) {
        return known;
      }
      try {
        return await model.detail(name);
      } catch (error) {
        Notification.error(`gpugeek: ${errorMessage(error)}`, { autoClose: 8000 });
        return null;
      }
    }
    if (model.list === null) {
      await model.refresh();
    }
    const live = model.live;
    if (live.length === 0) {
      Notification.info(
        model.error
          ? `gpugeek: ${model.error}`
          : 'No live GPU clusters. Start one with %gpugeek up.',
        { autoClose: 5000 }
      );
      return null;
    }
    if (live.length === 1) {
      return live[0];
    }
    const picked = await InputDialog.getItem({
      title: question,
      items: live.map(c => c.name),
      okLabel: 'Choose'
    });
    return picked.button.accept && picked.value ? (model.find(picked.value) ?? null) : null;
  }

  /** Confirms, stops, and reports the final cost. */
  export async function shutdown(model: ClustersModel, cluster: ICluster): Promise<void> {
    if (!cluster.live) {
      Notification.info(`${cluster.name} is already stopped.`, { autoClose: 4000 });
      return;
    }
    if (model.isStopping(cluster.name)) {
      return;
    }
    const sim = cluster.simulated ? ' (simulated)' : '';
    const body =
      `${cluster.name} (${cluster.backend}) costs ${usdPerHour(cluster.usd_per_hour)}${sim} ` +
      `and has cost ${usd(cluster.spent_usd)} so far. Shutting it down stops its running ` +
      'jobs and all its nodes.';
    const answer = await showDialog({
      title: `Shut down ${cluster.name}?`,
      body,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Shut down' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      const result = await model.stop(cluster.name);
      const final = `${usd(result.spent_usd)}${result.simulated ? ' (simulated)' : ''}`;
      Notification.success(`Shut down ${result.name}: final cost ${final}.`, {
        autoClose: 8000
      });
    } catch (error) {
      Notification.error(`Could not shut down ${cluster.name}: ${errorMessage(error)}`, {
        autoClose: false
      });
    }
  }
}
